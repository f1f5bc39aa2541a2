"""The sampler's exact steps on CPU rows, in numpy: comparisons, index sets, sorts
and argmax, whose results do not depend on how they are computed, so they may leave
torch's kernels (whose per-call cost dominates a small batch) without changing a bit.
Every floating-point sum or exponential stays torch's kernel on the same array.
Each helper falls back to torch, or returns None for the caller's torch path, on
other devices and dtypes."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


def uniforms(logits: torch.Tensor, generators: Sequence[torch.Generator | None]) -> torch.Tensor:
    """One uniform per generator [S], each ``torch.rand((), generator=g)``'s value (rand
    is ``empty().uniform_()``): on the CPU drawn into one tensor's elements, which costs
    ~30 % less than 0-d tensors stacked."""
    if logits.device.type != "cpu":
        return torch.stack([torch.rand((), generator=g, dtype=logits.dtype, device=logits.device) for g in generators])
    u = torch.empty(len(generators), dtype=logits.dtype)
    for v, g in zip(u.unbind(), generators):
        v.uniform_(generator=g)
    return u


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """Row-wise argmax, the first of ties (as torch's). On CPU numpy's, which is
    vectorised: 0.01 ms against torch's 0.25-0.4 ms for a 128k row."""
    if x.device.type == "cpu" and x.dtype == torch.float32:
        return torch.from_numpy(np.asarray(x.numpy().argmax(-1), dtype=np.int64))
    return x.argmax(-1)


def above_in_width(row: torch.Tensor, c: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where row [V] is above c (0-d), ascending, in a fixed width n: (ids [n], valid [n]),
    padded with id 0 and False; none valid when more than n are above."""
    if row.device.type == "cpu" and row.dtype == torch.float32:  # numpy's compare and nonzero: ~10x torch's
        found = torch.from_numpy(np.flatnonzero(row.numpy() > c.numpy()))
        ids = torch.zeros(n, dtype=torch.long)
        valid = torch.zeros(n, dtype=torch.bool)
        if found.numel() <= n:
            ids[:found.numel()] = found
            valid[:found.numel()] = True
        return ids, valid
    # Elsewhere without reading the device: the n largest, in id order, those above c.
    top = row.topk(n)
    ids = top.indices.sort().values
    return ids, (row.gather(0, ids) > c) & (top.values[-1] <= c)


def between(x: torch.Tensor, lo: torch.Tensor | None, hi: torch.Tensor | None) -> torch.Tensor:
    """Indices of x [V] with hi > x >= lo (None: no bound), ascending."""
    if x.device.type == "cpu" and x.dtype == torch.float32:  # numpy's compares and nonzero: ~3x torch's
        xn = x.numpy()
        inside = np.ones(xn.shape, dtype=bool) if hi is None else xn < hi.numpy()
        if lo is not None:
            inside &= xn >= lo.numpy()
        return torch.from_numpy(np.flatnonzero(inside))
    inside = torch.ones_like(x, dtype=torch.bool) if hi is None else x < hi
    if lo is not None:
        inside &= x >= lo
    return inside.nonzero().view(-1)


def candidate_draw(x: torch.Tensor, temps: Sequence[float], top_p: Sequence[float], min_p: Sequence[float],
                   u: torch.Tensor, m: torch.Tensor, total: torch.Tensor, c: torch.Tensor, ids: torch.Tensor,
                   cand: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """core.engine.sampling's candidate draw (top-p, min-p and the draw on each row's
    candidates, its arguments) on CPU float32 rows, the same tokens and flags bit for bit:
    the exponentials, softmaxes and cumulative sums are torch's kernels on the same
    arrays, everything else is numpy's (gathers, divisions, compares, masks: ~3x less
    per call than torch's at 16 rows of 512). The candidates' values are sorted without
    their permutation (ties hold equal values, so every sum over the sorted row is the
    same whatever their order; numpy sorts 16 x 512 in ~12 us against ~450 us for
    torch's stable argsort) and the kept prefix is mapped back by :func:`kept_by_place`.
    None where it does not apply: another device or dtype, a candidate at -inf or NaN."""
    if x.device.type != "cpu" or x.dtype != torch.float32:
        return None
    ninf = np.float32(-np.inf)
    t = np.asarray(temps, dtype=np.float32)[:, None]
    valid = cand.numpy()
    rows, idn = np.arange(len(temps))[:, None], ids.numpy()
    vals = x.numpy()[rows, idn] / t
    masked = np.where(valid, vals, ninf)
    if np.count_nonzero(masked > ninf) != np.count_nonzero(valid):
        return None  # then candidates are not exactly the values above -inf
    vals_s = -np.sort(-masked, axis=1)  # descending
    cand_s = vals_s > ninf
    with np.errstate(invalid="ignore", divide="ignore"):  # a row all -inf gives NaN, as torch's does
        probs = torch.from_numpy(vals_s - m.numpy()).exp_().numpy() / total.numpy()
    before = torch.from_numpy(probs).cumsum(-1).numpy() - probs  # mass strictly above each candidate
    keep = cand_s & (before < np.asarray(top_p, dtype=np.float32)[:, None])
    mp = np.asarray(min_p, dtype=np.float32)[:, None]
    if (mp > 0).any():
        probs2 = torch.from_numpy(np.where(keep, vals_s, ninf)).softmax(-1).numpy()
        keep &= ~((mp > 0) & (probs2 < probs2.max(-1, keepdims=True) * mp))
    ok = (cand_s & ~keep & (vals_s > c.numpy() / t)).any(-1)
    keep_by_id = kept_by_place(masked, vals_s, keep)
    if keep_by_id is None:  # the stable sort's permutation scatters keep back
        order = torch.from_numpy(masked).sort(dim=-1, descending=True, stable=True).indices
        keep_by_id = torch.zeros(keep.shape, dtype=torch.bool).scatter_(-1, order, torch.from_numpy(keep)).numpy()
    # the draw over the kept candidates in id order, as the reference's cumsum runs
    at = inverse_cdf_rows(torch.from_numpy(np.where(keep_by_id, vals, ninf)).softmax(-1), u)
    return torch.from_numpy(idn[rows[:, 0], at]), torch.from_numpy(ok)


def kept_by_place(masked: np.ndarray, vals_s: np.ndarray, keep: np.ndarray) -> np.ndarray | None:
    """keep [S, n] (over the sorted values) mapped back to the candidates' places, as
    the stable sort's permutation would scatter it, where each row keeps a prefix of
    its sorted values: every value above the last kept one, and of the values equal to
    it the first ones by place (the stable sort puts ties in place order). None where a
    row's kept set is not a prefix (rounding in the cumulative mass): the sort decides."""
    S, n = keep.shape
    kept = np.count_nonzero(keep, axis=1)
    if not np.array_equal(keep, np.arange(n) < kept[:, None]):
        return None
    last = vals_s[np.arange(S), np.maximum(kept - 1, 0)][:, None]
    above, tied = masked > last, masked == last
    ties = (kept - np.count_nonzero(above, axis=1))[:, None]  # how many of the tied values are kept
    out = above | (tied & (np.cumsum(tied, 1) <= ties))
    out[kept == 0] = False
    return out


def inverse_cdf_rows(probs: torch.Tensor, u: torch.Tensor) -> np.ndarray:
    """core.engine.sampling.inverse_cdf of CPU float32 rows [S, V] with uniforms u [S]:
    torch's cumulative sum, then the first index whose mass exceeds u times the row's
    total, counted in numpy (a nondecreasing row: searchsorted's right side); torch's
    searchsorted where a row's total is not finite."""
    cdf = probs.cumsum(-1)
    c = cdf.numpy()
    v = u.numpy() * c[:, -1]
    if not np.isfinite(v).all():
        at = torch.searchsorted(cdf, torch.from_numpy(v).view(-1, 1), right=True).view(-1).numpy()
    else:
        at = np.count_nonzero(c <= v[:, None], axis=1)
    return np.minimum(at, probs.shape[-1] - 1)


def finite_rows(logits: torch.Tensor) -> torch.Tensor:
    """bool [B]: whether each row of logits [B, V] is finite throughout (its max and min
    are finite exactly when all of it is: both propagate NaN), with the non-finite
    entries zeroed in place (the identity on healthy rows). On CPU float32 rows numpy's
    two reductions, and the zeroing only where a row needs it: ~5 torch calls less a step."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        a = logits.numpy()
        finite = np.isfinite(a.max(-1)) & np.isfinite(a.min(-1))
        if not finite.all():
            np.nan_to_num(a, copy=False, nan=0.0, posinf=0.0, neginf=0.0)
        return torch.from_numpy(finite)
    finite = torch.isfinite(logits.amax(-1)) & torch.isfinite(logits.amin(-1))
    torch.nan_to_num_(logits, nan=0.0, posinf=0.0, neginf=0.0)
    return finite
