"""core.model.memory: handing memory back never disturbs what is still in use."""
import mmap

import numpy as np
import torch

from core.model.memory import release_freed_heap, release_mapped_pages


def test_released_mapped_pages_read_back_from_the_file(tmp_path):
    f = tmp_path / "w.bin"
    want = np.arange(4 * mmap.PAGESIZE, dtype=np.float32)
    want.tofile(f)
    mapped = np.memmap(f, dtype=np.float32, mode="c")  # a private, copy-on-write map (as the loaders use)
    assert float(mapped.sum()) == float(want.sum())  # resident now
    release_mapped_pages(mapped.ctypes.data, mapped.nbytes)
    assert np.array_equal(mapped, want)  # dropped pages come back from the file
    release_mapped_pages(mapped.ctypes.data, 0)  # nothing to do
    release_mapped_pages(mapped.ctypes.data + 1, 10)  # inside one page: kept


def test_releasing_the_heap_keeps_live_tensors():
    t = torch.arange(1 << 20, dtype=torch.float32)
    garbage = [torch.ones(1 << 16) for _ in range(64)]
    del garbage
    release_freed_heap()
    assert float(t[-1]) == (1 << 20) - 1
