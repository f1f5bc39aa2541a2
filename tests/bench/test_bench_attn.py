"""The attention micro-benchmark compares like with like: its SDPA peer computes what the
kernel computes on the same views of a cache."""
import pytest
import torch

from bench import bench_attn
from core.model.kernels import ops


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_sdpa_peer_and_the_kernel_agree_on_the_bench_inputs(dtype):
    if ops.kernels() is None:
        pytest.skip("no compiled kernels here")
    q, k, v, lengths = bench_attn.inputs(3, 40, 8, 4, 8, dtype)
    assert k.shape == (3, 4, 40, 8) and not k.is_contiguous()  # a view of a bigger cache
    got = ops.attn_decode(q, k, v, lengths).float()
    want = bench_attn.sdpa_rows(q, k, v, lengths).transpose(1, 2).reshape(3, 1, 64).float()
    assert (got - want).abs().max() < (1e-5 if dtype == torch.float32 else 2e-2)
    row = {"case": (3, 40, 8, 4, 8), "dtype": "float32", "after": 2e-5, "sdpa per row": 5e-5}
    assert bench_attn.markdown_row(row, ["after", "sdpa per row"]) == "| 3 x 40 | 8/4 of 8 | float32 | 20 | 50 | 2.50x |"
