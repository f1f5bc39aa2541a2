"""GGUF blocks straight into the CPU int4 kernel's layout, in byte operations.

Opening a Q4_K_M or Q8_0 file used to decode every weight into int16, widen it to int32 and
hand it to ``torch._convert_weight_to_int4pack_for_cpu``, with the Q6_K and two-plane
arithmetic in float32 over whole 1024-row chunks (tens of MB, so every temporary page
faulted): 22 s of CPU for a 1B Q4_K_M file. Here the file's bytes are rearranged into the
kernel's bytes with uint8 operations (no value is widened; only the per-group scales and
Q6_K's rounding step are float32), a few hundred KB at a time so the temporaries stay in
cache, into one preallocated tensor.

The kernel's layout follows the capability torch dispatches to at run time
(:data:`core.model.quant.CPU_LAYOUTS`, probed once per process by
:func:`core.model.quant.cpu_layout`): blocks of 64 output rows with byte j holding rows j
and j+32 (AVX-512), of 32 rows with rows j and j+16 (AVX2), or of 32 rows with rows 2j and
2j+1 (scalar); for each input column ``block/2`` bytes. Every step here is a whole number
of 64-row blocks, so of every layout's blocks; an unknown layout takes torch's packer.

The values and the float32 scale arithmetic are the same operations in the same order as
:func:`core.model.pack.pack_gguf`'s general path, so the packed layers are bit for bit the
same (tests): a cache written by either is valid for both.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Callable

import torch

from core.model.quant import CpuLayout, cpu_layout

#: weights rearranged per step (64-row blocks up to this many): the float32 temporaries of
#: Q6_K stay ~4 MB, where whole 1024-row chunks page faulted (5x slower per pass)
STEP_WEIGHTS = 1 << 20
#: bytes between the rows of the paired bytes beyond K: at a power-of-two row stride the
#: rows a transposed copy reads together share cache sets (a 16x8192 block: 1.4 ns a byte
#: transposed, 0.4 ns with this much padding)
ROW_PAD = 64
#: GGUF types packed here: the ones llama.cpp's common Q4_K_M / Q6_K / Q8_0 files hold
KINDS = {"Q4_K": (256, 144, 1), "Q6_K": (256, 210, 2), "Q8_0": (32, 34, 2)}


def layout_matches() -> bool:
    """Whether this process's packer layout is one :func:`pack` writes (every known one:
    :data:`core.model.quant.CPU_LAYOUTS`)."""
    return cpu_layout() is not None


def _layout() -> CpuLayout:
    lay = cpu_layout()
    if lay is None:
        raise RuntimeError("torch's CPU int4 layout is not one LlamaDesk can write")
    return lay


def _pairs(u: torch.Tensor, lay: CpuLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """Views [R/block, block/2, ...] of the rows of u ([R, ...], R a multiple of the block)
    that go to the low and the high nibbles of the kernel's bytes."""
    v = u.view(u.shape[0] // lay.block, lay.block, *u.shape[1:])
    return v[:, lay.lo], v[:, lay.hi]


def one_plane(q: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """4-bit values q (uint8 [R, K], 0..15, R a multiple of 64) -> the kernel's bytes
    [R/block, K, block/2], into ``out`` if given: rows are paired first, so the transpose
    moves half the bytes."""
    a, b = _pairs(q, _layout())
    paired = (a | (b << 4)).transpose(1, 2)
    return paired.contiguous() if out is None else out.copy_(paired)


def _scratch(out: torch.Tensor, k: int) -> torch.Tensor:
    """Room for the paired bytes [blocks, rows, K] that :func:`_to_columns` moves into
    ``out`` [blocks, >= K, rows], its rows :data:`ROW_PAD` bytes apart beyond K."""
    blocks, _, rows = out.shape
    return torch.empty(blocks, rows, k + ROW_PAD, dtype=torch.uint8)[..., :k]


def _to_columns(p: torch.Tensor, out: torch.Tensor) -> None:
    """Bytes p [blocks, rows, K] (paired row j of each block, its K columns) into ``out``
    [blocks, K, rows], one block at a time: a 2-D transposed copy takes torch's
    blocked-transpose path, 3-4x faster than one strided copy over all blocks."""
    for i in range(p.shape[0]):
        out[i].copy_(p[i].t())


def two_planes(u: torch.Tensor, out: torch.Tensor, signed: bool = False) -> None:
    """8-bit values u (uint8 [R, ...] flattening to [R, K]; int8 read as ``u + 128`` if
    ``signed``) as a high and a low 4-bit plane, side by side along K as the kernel sees
    them over ``[x, x]``, into ``out`` [R/block, 2K, block/2]."""
    k = out.shape[1] // 2
    a, b = _pairs(u, _layout())  # e.g. rows j and j + 32 of each 64-row block (AVX-512)
    p = _scratch(out, k)
    torch.bitwise_or(a >> 4, b & 0xF0, out=p.view(a.shape))
    if signed:  # (x ^ 0x80) >> 4 == (x >> 4) ^ 8, (x ^ 0x80) & 0xF0 == (x & 0xF0) ^ 0x80
        p ^= 0x88
    _to_columns(p, out[:, :k])
    torch.bitwise_or(a & 15, b << 4, out=p.view(a.shape))  # the low nibbles see no flip
    _to_columns(p, out[:, k:])


def _f16(b: torch.Tensor) -> torch.Tensor:
    """Little-endian fp16 from the last dim's 2 bytes, as float32; ValueError if any is
    NaN or infinite (the values are integers: only a block scale can be)."""
    d = b.contiguous().view(torch.float16).squeeze(-1).float()
    if not torch.isfinite(d).all():
        raise ValueError("holds NaN or infinite block scales: corrupt weights")
    return d


def _planes_scales(d: torch.Tensor, zero: torch.Tensor | float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Scales and zeros of the two planes for values ``d * (u - 128) + zero``: the high
    plane 16d with the offset's bfloat16 part, the low plane d with what that leaves."""
    d = d.bfloat16().float()
    z = 8 * d + zero
    z_hi = z.bfloat16().float()
    return torch.cat([16 * d, d], 1), torch.cat([z_hi, z - z_hi], 1)


def _q8_0(b: torch.Tensor, r: int, k: int, out: torch.Tensor):
    """Q8_0: 32 int8 values under an fp16 d. The values are gathered out of their 34-byte
    blocks first: the nibble operations then run contiguous (30% less time than over the
    strided bytes)."""
    b = b.view(r, k // 32, 34)
    two_planes(b[..., 2:].reshape(r, k), out, signed=True)
    return _planes_scales(_f16(b[..., :2]))


def _q4_k(b: torch.Tensor, r: int, k: int, out: torch.Tensor):
    """Q4_K: 8 groups of 32 nibbles under 6-bit scales and mins, themselves under fp16 d, dmin.
    Each 32-byte run holds weights i (low nibble) and i + 32 (high) of a 64-weight run, so
    the bytes of the two rows the kernel pairs in a byte (j and j + 32 on AVX-512, j and
    j + 16 on AVX2, 2j and 2j + 1 on the scalar path) recombine without unpacking."""
    b = b.view(r, k // 256, 144)
    d, dmin = _f16(b[..., 0:2]).unsqueeze(-1), _f16(b[..., 2:4]).unsqueeze(-1)
    s = b[..., 4:16].to(torch.int32)
    sc = torch.cat([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], -1)
    mn = torch.cat([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], -1)
    scale, zero = (d * sc).reshape(r, -1), (-(dmin * mn)).reshape(r, -1)
    lo, hi = _pairs(b[..., 16:].view(r, k // 256, 4, 32), _layout())  # [blocks, j, super, run, i]
    # weight i of each run: both rows' low nibbles; weight i + 32: their high nibbles
    p = _scratch(out, k)
    runs = p.view(*lo.shape[:-1], 2, 32)
    torch.bitwise_or(lo & 15, hi << 4, out=runs[..., 0, :])
    torch.bitwise_or(lo >> 4, hi & 0xF0, out=runs[..., 1, :])
    _to_columns(p, out)
    return scale, zero + 8 * scale


def _q6_k(b: torch.Tensor, r: int, k: int, out: torch.Tensor):
    """Q6_K: 6-bit values with an int8 scale per 16 under fp16 d, requantized to one scale
    per 32 as :func:`core.model.pack._requantize_q6_k` does (same float32 operations)."""
    b = b.view(r, k // 256, 210)
    ql = b[..., :128].reshape(r, -1, 2, 1, 64)
    qh = b[..., 128:192].reshape(r, -1, 2, 1, 32)
    low = torch.cat([ql & 15, ql >> 4], 3).view(r, -1, 2, 128)
    high = torch.cat([qh & 3, (qh >> 2) & 3, (qh >> 4) & 3, (qh >> 6) & 3], 3).view(r, -1, 2, 128)
    q = low | (high << 4)  # 0..63, weights in the file's order
    s = (_f16(b[..., 208:210]).unsqueeze(-1) * b[..., 192:208].contiguous().view(torch.int8).float())
    s = s.reshape(r, -1, 2)  # d*sc of each pair of 16-weight sub-blocks
    big = torch.where(s[..., 0].abs() >= s[..., 1].abs(), s[..., 0], s[..., 1])
    ratio = torch.where(big.unsqueeze(-1) == 0, torch.zeros_like(s), s / big.unsqueeze(-1))
    # 4 * (q - 32) is -128..124: exact in int8 as the byte 4q ^ 0x80, so the float32 passes
    # start at the multiply; the result goes back through int8, x + 128 being x's byte ^ 0x80
    w = ((q << 2) ^ 0x80).view(torch.int8).view(r, -1, 2, 16).float().mul_(ratio.unsqueeze(-1))
    u = w.round_().clamp_(-128, 127).to(torch.int8).view(torch.uint8) ^ 0x80
    two_planes(u.view(r, k), out)
    return _planes_scales(big / 4)


_DECODERS = {"Q4_K": _q4_k, "Q6_K": _q6_k, "Q8_0": _q8_0}


def pack(rows: torch.Tensor, kind: str, n: int, k: int,
         tick: Callable[[], None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed uint8 [N', planes*K/2], scale_zeros bfloat16 [planes*K/32, N', 2]) of a GGUF
    tensor's rows (uint8 [N, bytes per row]) of one of :data:`KINDS`, in this process's
    packer layout; N' = N padded to 64 rows, a multiple of every layout's block (padding
    rows are zero bytes: scale and zero 0). Raises ValueError on a non-finite
    block scale (the values are integers: only a scale can be NaN or infinite). ``tick`` is
    called after every step of this thread's (a few ms): a load's cancel check, so a
    128k-row output layer does not hold a cancel for a second.

    Steps are shared round-robin by this thread and :func:`_helpers` (as many threads in
    all as torch's, at most :data:`MAX_THREADS`), each running torch single-threaded: under
    load an OpenMP team waits at every barrier of every small operation for a descheduled
    member (a 1B Q4_K_M open took 100 s of wall time at load 8 with 2 OpenMP threads, 21 s
    with 1), while threads that each own their steps just share the cores."""
    block, nbytes, planes = KINDS[kind]
    lay = _layout()
    total = n + -n % 64
    packed = torch.empty(total // lay.block, planes * k, lay.block // 2, dtype=torch.uint8)
    sz = torch.empty(planes * k // 32, total, 2, dtype=torch.bfloat16)
    step = max(64, STEP_WEIGHTS // k // 64 * 64)

    def run(r0: int) -> None:
        chunk = rows[r0:r0 + step]
        r = min(step, total - r0)
        if chunk.shape[0] < r:  # the last rows: zero bytes up to the 64-row block
            chunk = torch.cat([chunk, chunk.new_zeros(r - chunk.shape[0], chunk.shape[1])])
        scale, zero = _DECODERS[kind](chunk, r, k, packed[r0 // lay.block:(r0 + r) // lay.block])
        sz[:, r0:r0 + r, 0] = scale.t()
        sz[:, r0:r0 + r, 1] = zero.t()

    _shared(run, range(0, total, step), tick)
    sz[:, n:] = 0
    return packed.view(total, planes * k // 2), sz


#: threads that pack one tensor's steps together (this one included)
MAX_THREADS = 4
_POOL: list[ThreadPoolExecutor] = []


def _helpers() -> ThreadPoolExecutor:
    """The packing helper threads (created once; torch runs single-threaded in them)."""
    if not _POOL:
        _POOL.append(ThreadPoolExecutor(MAX_THREADS - 1, thread_name_prefix="pack",
                                        initializer=torch.set_num_threads, initargs=(1,)))
    return _POOL[0]


def _shared(run: Callable[[int], None], steps: range, tick: Callable[[], None] | None) -> None:
    """``run`` every step, round-robin over this thread and ``threads - 1`` helpers; a
    helper's error is raised here at the latest once this thread's steps are done, and
    nothing runs on after this returns or raises."""
    threads = min(torch.get_num_threads(), MAX_THREADS)
    saved = torch.get_num_threads()
    torch.set_num_threads(1)  # this thread's own OpenMP setting: restored below
    futures: list[Future] = []
    try:
        for i, r0 in enumerate(steps):
            if i % threads:
                futures.append(_helpers().submit(run, r0))
                continue
            run(r0)
            if tick is not None:
                tick()
            while futures and futures[0].done():
                futures.pop(0).result()
        for f in futures:
            f.result()
    finally:
        for f in futures:
            f.cancel()
        wait(futures)
        torch.set_num_threads(saved)
