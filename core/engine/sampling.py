"""Token sampling: pure functions over logits plus a small settings object.

Every filter takes float32 logits [..., V] and returns logits with the removed tokens
set to -inf, so they compose in a fixed order: repetition penalty, temperature, top-k,
top-p, min-p. Randomness comes only from the request's own ``torch.Generator``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
import torch

from core.engine.cpu_rows import above_in_width, argmax_rows, between, candidate_draw, uniforms
from core.engine.settings import SamplingParams


def seeded_generator(params: SamplingParams, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator seeded with ``params``' seed (drawn now if None), on ``device``."""
    g = torch.Generator(device=device)
    g.manual_seed(int(params.resolved().seed))
    return g


def apply_repetition_penalty(logits: torch.Tensor, previous: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL-style penalty on tokens already seen: positive logits divided, negative multiplied.

    Args:
        logits: [V] or [B, V].
        previous: token ids seen so far ([n] or [B, n]); may be empty.
    """
    if penalty == 1.0 or previous.numel() == 0:
        return logits
    squeeze = logits.dim() == 1
    lg, prev = (logits.unsqueeze(0), previous.view(1, -1)) if squeeze else (logits, previous)
    seen = lg.gather(-1, prev)
    seen = torch.where(seen > 0, seen / penalty, seen * penalty)
    out = lg.scatter(-1, prev, seen)
    return out.squeeze(0) if squeeze else out


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return logits if temperature in (0, 1.0) else logits / temperature


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits (ties at the k-th value are kept too)."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float | torch.Tensor) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches p.

    p is a float, or a tensor [B, 1] with one value per row of logits [B, V].
    """
    if not isinstance(p, torch.Tensor) and p >= 1.0:
        return logits
    if not isinstance(p, torch.Tensor):
        p = torch.tensor(p, dtype=logits.dtype, device=logits.device)
    # Stable, so a row sorts the same alone or in a batch of comparison lanes.
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    probs = sorted_logits.softmax(-1)
    before = probs.cumsum(-1) - probs  # mass strictly above each token
    drop_sorted = before >= p  # the top token always has 0 before it, so it stays
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Drop tokens whose probability is below min_p times the top token's."""
    if min_p <= 0:
        return logits
    probs = logits.softmax(-1)
    threshold = probs.max(-1, keepdim=True).values * min_p
    return logits.masked_fill(probs < threshold, float("-inf"))


def filter_logits(logits: torch.Tensor, params: SamplingParams, previous: torch.Tensor | None = None) -> torch.Tensor:
    """All of a request's filters in order; the result's softmax is what is sampled."""
    return filter_rows(logits.unsqueeze(0), [params], [previous])[0]


def filter_rows(logits: torch.Tensor, params: list[SamplingParams],
                previous: list[torch.Tensor | None]) -> torch.Tensor:
    """filter_logits for each row of logits [B, V] with its own settings.

    Rows are independent; the one expensive step, the top-p sort, runs once for all the
    rows that need it (comparison lanes decode together, so they sample together).
    """
    logits = apply_logit_bias(logits, params)
    out = []
    for row, q, prev in zip(logits, params, previous):
        if prev is not None:
            row = apply_repetition_penalty(row, prev, q.repetition_penalty)
        if not q.greedy:
            row = top_k_filter(apply_temperature(row, q.temperature), q.top_k)
        out.append(row)
    rows = torch.stack(out)
    nucleus = [i for i, q in enumerate(params) if not q.greedy and q.top_p < 1.0]
    if nucleus:
        idx = torch.tensor(nucleus, device=rows.device)
        p = torch.tensor([params[i].top_p for i in nucleus], dtype=rows.dtype, device=rows.device).view(-1, 1)
        rows[idx] = top_p_filter(rows[idx], p)
    for i, q in enumerate(params):
        if not q.greedy and q.min_p > 0:
            rows[i] = min_p_filter(rows[i], q.min_p)
    return rows


_BYTE_BITS: dict = {}  # device -> bool [256, 8]: the bits of every byte value, lowest first


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor | None) -> torch.Tensor:
    """Logits [B, V] with the tokens a constraint forbids set to -inf.

    bitmask: int32 [B, ceil(V/32)] (bit i of word w allows token 32*w + i; see
    core.engine.constrain), or None for no constraint. Applied before every other filter.
    """
    if bitmask is None:
        return logits
    B, V = logits.shape
    words = bitmask.contiguous()
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        # numpy's unpackbits and masked copy: 1.5x (one lane at 128k) to 5x (a mostly
        # allowed mask) faster than torch's masked_fill here; torch's is not vectorised.
        forbid = np.unpackbits(~words.numpy().view(np.uint8), axis=-1, count=V, bitorder="little").view(bool)
        out = logits.clone()
        np.copyto(out.numpy(), np.float32(-np.inf), where=forbid)
        return out
    dev = logits.device
    table = _BYTE_BITS.get(dev)
    if table is None:
        table = _BYTE_BITS[dev] = ((torch.arange(256, device=dev).unsqueeze(1) >> torch.arange(8, device=dev)) & 1).bool()
    # On an accelerator: the packed mask crosses, then one lookup per byte (little-endian
    # words: byte k of word w holds tokens 32w+8k..+7).
    allowed = table[words.to(dev, non_blocking=True).view(torch.uint8).long()].view(B, -1)[:, :V]
    return torch.where(allowed, logits, float("-inf"))


def apply_logit_bias(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Logits [B, V] plus each row's ``logit_bias`` (one scatter for all rows; ids past
    the vocabulary are ignored). Returns ``logits`` itself when no row has a bias."""
    pairs = [(r, t, b) for r, q in enumerate(params) for t, b in q.logit_bias.items() if t < logits.shape[-1]]
    if not pairs:
        return logits
    rows, toks, bias = zip(*pairs)
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64):
        # numpy's add at the pairs: no three tensors built from lists (ids are distinct
        # per row, so this is index_put's accumulate, value for value)
        out = logits.clone()
        a = out.numpy()
        a[rows, toks] += np.asarray(bias, dtype=a.dtype)
        return out
    dev = logits.device
    return logits.index_put((torch.tensor(rows, device=dev), torch.tensor(toks, device=dev)),
                            torch.tensor(bias, dtype=logits.dtype, device=dev), accumulate=True)


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from probabilities [V] by inverse CDF: one uniform from ``generator``.

    torch.multinomial costs ~1 ms for a 32k vocabulary on CPU; this ~0.05 ms.
    """
    u = torch.rand((), generator=generator, dtype=probs.dtype, device=probs.device)
    return int(inverse_cdf(probs.unsqueeze(0), u.view(1))[0])


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Row-wise: the first index whose cumulative mass exceeds u [B] times the row's total."""
    cdf = probs.cumsum(-1)
    # right=True: the first token whose cumulative mass exceeds u, never a zero-mass one.
    at = torch.searchsorted(cdf, (u * cdf[:, -1]).view(-1, 1), right=True)
    return at.view(-1).clamp_max(probs.shape[-1] - 1)


CANDIDATES = 512  # about how many of a row's largest logits the fast sampler looks at first
SAMPLE = 4096  # strided sample of a row that places the top-p window when the candidates fall short
# The reference sums softmax probabilities in sorted order; ours come from the same kernel
# in id order and differ by up to ~4e-7 in that sum on flat rows (the most measured at 32k and
# 128k, std 0.3-2, near p 0.9) where torch's kernels are AVX-512's (16 lanes). Its AVX2 and
# scalar kernels sum in fewer lanes, each over more terms: 2.9e-6 measured on a 20k row and
# ~sqrt(V/8) float32 steps (~8e-6) to expect at 128k, so there the margin is wider and more
# cuts go to the sort (slower near p, never different).
# A window cut that close to p is left to the reference's sort.
ROUNDING = 5e-7 if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else 2e-5


@dataclass
class Choice:
    """What :func:`choose_tokens` picked: ids and raw log-probs per row, read once."""
    tokens: torch.Tensor  # [B] on the logits' device
    ids: list[int]
    logprobs: list[float]  # under the raw (unfiltered) distribution
    flags: list[bool] | None = None  # the caller's ``flags`` [B], read with the ids


def choose_tokens(logits: torch.Tensor, params: Sequence[SamplingParams],
                  previous: Sequence[torch.Tensor | None], generators: Sequence[torch.Generator | None],
                  candidates: int = CANDIDATES, flags: torch.Tensor | None = None,
                  bitmask: torch.Tensor | None = None) -> Choice:
    """Each row's next token, as ``sample`` would choose it, without sorting the vocabulary.

    The same tokens as filter_rows + argmax/draw with the same generators. Sampled rows
    run top-p/min-p on their largest logits (:func:`_candidate_draw`, about ``candidates``
    tokens gathered by block maxima, all rows in one pass) against the whole row's softmax
    mass, and draw with one uniform per row. A row whose kept set might reach past its
    candidates (flat distributions) is redone on the same uniform by :func:`_window_draw`,
    which sorts only the values around the top-p cut, and by the reference's full sort in
    the rare case the window misses. The device is read once (ids, log-probs, flags), again
    only for redone rows.

    Args:
        logits: float32 [B, V]; previous: token ids per row for the repetition penalty.
        flags: optional bool [B] on the device (the engine's "row was finite"), read back
            in the same transfer as the ids so a step costs one host synchronisation.
        bitmask: the step's constraint masks (:func:`apply_bitmask`), applied first; the
            log-probs stay those of the raw distribution.
    """
    B, V = logits.shape
    dev = logits.device
    # Row by row below: a decode step's [B, V] can be column-major (stride (1, B)), which
    # makes every row pass strided; one copy is far cheaper.
    logits = logits.contiguous()
    x_all = _prepared(logits, params, previous, bitmask)
    sampled = [i for i, q in enumerate(params) if not q.greedy]
    # greedy rows: the reference's argmax, first of ties
    tokens = argmax_rows(x_all) if len(sampled) < B else torch.zeros(B, dtype=torch.long, device=dev)
    ok = torch.ones(0, dtype=torch.bool, device=dev)
    if sampled:
        u = uniforms(logits, [generators[i] for i in sampled])
        sel = torch.tensor(sampled, device=dev)
        x = x_all if len(sampled) == B else x_all.index_select(0, sel)  # [S, V]
        qs = [params[i] for i in sampled]
        x, temps = _top_k_rows(x, qs)
        lse, scan = _scan(logits, x, sampled, temps, candidates)
        fast, ok = _candidate_draw(x, temps, qs, u, *scan)
        tokens = fast if len(sampled) == B else tokens.index_copy(0, sel, fast)
    else:
        lse, _ = _scan(logits, logits[:0], [], [], candidates)
    logprob = logits.gather(-1, tokens.view(B, 1)).view(B) - lse
    parts = [tokens.double(), logprob.double()] + ([] if flags is None else [flags.double()])
    read = torch.cat(parts + [ok.double()]).tolist()
    ids, lps = [int(t) for t in read[:B]], read[B:2 * B]
    flag_list = None if flags is None else [bool(f) for f in read[2 * B:3 * B]]
    bad = [k for k, good in enumerate(read[len(read) - ok.numel():]) if not good]
    if bad:  # same uniforms, so the stream of draws does not depend on which path ran
        slow = torch.stack([_window_draw(_tempered(x[k], temps[k]), qs[k], u[k]) for k in bad])
        tokens = tokens.index_copy(0, sel.index_select(0, torch.tensor(bad, device=dev)), slow)
        logprob = logits.gather(-1, tokens.view(B, 1)).view(B) - lse
        read = torch.cat([tokens.double(), logprob.double()]).tolist()
        ids, lps = [int(t) for t in read[:B]], read[B:]
    return Choice(tokens, ids, lps, flag_list)


def _prepared(logits: torch.Tensor, params: Sequence[SamplingParams], previous, bitmask) -> torch.Tensor:
    """The rows with the constraint mask, logit bias and repetition penalty applied
    (``logits`` itself when none applies). Temperature comes later, row by row: a
    division of the whole batch writes a fresh [B, V] tensor, and at 128k x 8 rows its
    page faults alone cost more than dividing each row in cache."""
    masked = apply_logit_bias(apply_bitmask(logits, bitmask), params)
    x = masked
    for i, (q, prev) in enumerate(zip(params, previous)):
        if prev is not None and q.repetition_penalty != 1.0 and prev.numel():
            if x is logits:
                x = logits.clone()
            x[i] = apply_repetition_penalty(masked[i], prev, q.repetition_penalty)
    return x


def _tempered(row: torch.Tensor, temperature: float) -> torch.Tensor:
    """apply_temperature's division (dividing by 1.0 is exact, so it is skipped)."""
    return row if temperature == 1.0 else row / temperature


def _scan(logits: torch.Tensor, x: torch.Tensor, sampled: Sequence[int], temps: Sequence[float],
          candidates: int):
    """Every pass over whole rows, one row at a time so that each row's passes run while
    it is in cache (at 128k x 8 rows the batch does not fit; batched passes, with their
    fresh [B, V] temporaries, cost 2-3x as much here).

    Returns:
        lse [B]: logsumexp of each raw row (torch.logsumexp is unfused: 2x slower even
            for one row), and for the sampled rows x [S, V] with temperatures ``temps``:
        (m [S, 1], the tempered row's maximum; total [S, 1], its softmax denominator
        exp(x / T - m) summed; c [S, 1], the candidate threshold (untempered);
        ids [S, n], cand [S, n]: the tokens above c, in id order).
    """
    B, V = logits.shape
    S = x.shape[0]
    if at_once(logits):
        return _scan_at_once(logits, x, temps, candidates)
    buf = torch.empty_like(logits[0])
    # The candidates: values above the kc-th largest of every s-th value, about
    # ``candidates`` of them (ties included). A fixed width n, so that a row's arrays (and
    # so its rounding) do not depend on the other rows of the batch; a row with more
    # candidates than that goes to the window.
    s, kc, n = _widths(V, candidates)
    lse, m, total, c, found = [], [], [], [], []
    where = {r: k for k, r in enumerate(sampled)}
    for r in range(B):
        row = logits[r]
        top = row.amax()
        top = torch.where(torch.isfinite(top), top, 0.0)  # an all -inf row gives -inf, as torch's does
        lse.append(torch.sub(row, top, out=buf).exp_().sum().log_() + top)
        k = where.get(r)
        if k is None:
            continue
        xr, t = x[k], temps[k]
        top = xr.amax() / t  # division is monotone: the tempered row's maximum
        m.append(top)
        # exp of the gap to the max, summed: softmax's denominator, computed as it does
        total.append((torch.div(xr, t, out=buf) if t != 1.0 else buf.copy_(xr)).sub_(top).exp_().sum())
        c.append(_threshold(xr[::s], kc))
        found.append(above_in_width(xr, c[-1], n))
    lse = torch.stack(lse)
    if not S:
        return lse, None
    ids, cand = (torch.stack(v) for v in zip(*found))
    col = lambda vs: torch.stack(vs).view(S, 1)  # noqa: E731
    return lse, (col(m), col(total), col(c), ids, cand)


def _widths(V: int, candidates: int) -> tuple[int, int, int]:
    """(s, kc, n): every s-th value, its kc-th largest the candidates' threshold, the
    candidates held in a fixed width n (see :func:`_scan`)."""
    s = max(1, min(16, V // (4 * candidates)))
    return s, min(-(-V // s), max(1, candidates // s)), min(V, 2 * candidates)


def _threshold(sub: torch.Tensor, kc: int) -> torch.Tensor:
    """The kc-th largest of each row of ``sub``: its minimum where kc is the whole row (a
    vocabulary within the candidates: topk would sort it all for the same value; only a
    row holding NaN, which the engine ends with an error, differs)."""
    return sub.amin(-1) if kc == sub.shape[-1] else sub.topk(kc, dim=-1).values[..., -1]


AT_ONCE = 32768  # torch's intra-op grain: a smaller [B, V] reduces on one thread, as one row does


def at_once(logits: torch.Tensor) -> bool:
    """Whether :func:`_scan`'s passes may run on the whole batch at once with every row's
    results bit-identical to its own passes: a small batch (B x V within one grain, so no
    reduction is split across threads) on the CPU whose rows start at the same place in
    the vector kernels' 64-value blocks as a lone row does (their scalar tails hold the
    same values)."""
    B, V = logits.shape
    return logits.device.type == "cpu" and logits.dtype == torch.float32 and B * V <= AT_ONCE and V % 64 == 0


def _scan_at_once(logits: torch.Tensor, x: torch.Tensor, temps: Sequence[float], candidates: int):
    """:func:`_scan` for a small batch (:func:`at_once`): each pass once over all rows,
    not ~10 torch calls per row (at 16 rows of a 512-token vocabulary those calls were
    most of the sampler's time), the same values bit for bit."""
    S, V = x.shape
    # Maxima, minima, differences and quotients in numpy (exact, so the same values),
    # exponentials, sums and logarithms with torch's kernels: ~10 fewer torch calls.
    ln, xn = logits.numpy(), x.numpy()
    with np.errstate(invalid="ignore"):
        top = ln.max(-1, keepdims=True)
        top = np.where(np.isfinite(top), top, np.float32(0.0))
        lse = torch.from_numpy(torch.from_numpy(ln - top).exp_().sum(-1).log_().numpy() + top[:, 0])
        if not S:
            return lse, None
        s, kc, n = _widths(V, candidates)
        t = np.asarray(temps, dtype=np.float32)[:, None]
        m = xn.max(-1, keepdims=True) / t
        total = torch.from_numpy((xn / t) - m).exp_().sum(-1, keepdim=True)
    c = xn[:, ::s].min(-1, keepdims=True) if kc == -(-V // s) else _threshold(x[:, ::s], kc).view(S, 1).numpy()
    above = xn > c
    # each row's ids above c first, ascending (a stable sort of booleans is a radix pass)
    ids = (~above).argsort(axis=1, kind="stable")[:, :n]
    count = above.sum(1, keepdims=True)
    # a row with more than n goes to the window, as above_in_width says; padding is id 0
    valid = (np.arange(n) < count) & (count <= n)
    ids[~valid] = 0
    return lse, (torch.from_numpy(m), total, torch.from_numpy(c), torch.from_numpy(ids), torch.from_numpy(valid))


def _top_k_rows(x: torch.Tensor, qs: Sequence[SamplingParams]) -> tuple[torch.Tensor, list[float]]:
    """Rows x [S, V] and the temperature still to apply to each: rows with a top_k come
    back tempered and cut by top_k_filter (temperature 1 from then on), so the other
    filters and the draw see top-k as part of their logits."""
    temps = [float(q.temperature) for q in qs]
    rows = [i for i, q in enumerate(qs) if 0 < q.top_k < x.shape[-1]]
    if rows:
        x = x.clone()
        for i in rows:
            x[i] = top_k_filter(_tempered(x[i], temps[i]), qs[i].top_k)
            temps[i] = 1.0
    return x, temps


def _candidate_draw(x: torch.Tensor, temps: Sequence[float], qs: Sequence[SamplingParams], u: torch.Tensor,
                    m: torch.Tensor, total: torch.Tensor, c: torch.Tensor, ids: torch.Tensor, cand: torch.Tensor):
    """Top-p, min-p and the draw on each row's largest logits, all rows at once.

    x [S, V] is untempered (``temps`` per row); m, total, c, ids and cand come from
    :func:`_scan`. The candidates, divided by the temperature, sort as the reference sorts
    its tempered row (ties by id). A row's answer is exact when a candidate tempered above
    c / T is dropped: every token outside (<= c, so <= c / T tempered) sorts after it and
    is dropped too. Rows with neither top-p nor min-p draw from the whole row, as the
    reference does.

    Returns:
        (tokens [S], exact [S]).
    """
    S, V = x.shape
    fast = candidate_draw(x, temps, [q.top_p if q.top_p < 1.0 else math.inf for q in qs], [q.min_p for q in qs],
                          u, m, total, c, ids, cand)
    tokens, ok = fast if fast is not None else _candidate_draw_torch(x, temps, qs, u, m, total, c, ids, cand)
    whole = [i for i, q in enumerate(qs) if q.top_p >= 1.0 and q.min_p <= 0]
    for i in whole:  # nothing (more) to filter: the reference's own draw over the whole row
        tokens[i] = inverse_cdf(_tempered(x[i], temps[i]).softmax(-1).view(1, V), u[i].view(1))[0]
        ok[i] = True
    return tokens, ok


def _candidate_draw_torch(x: torch.Tensor, temps: Sequence[float], qs: Sequence[SamplingParams], u: torch.Tensor,
                          m: torch.Tensor, total: torch.Tensor, c: torch.Tensor, ids: torch.Tensor,
                          cand: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_candidate_draw`'s tokens and exact flags with torch alone (accelerators,
    float64; core.engine.cpu_rows.candidate_draw on CPU float32 rows)."""
    S, V = x.shape
    dev, ninf = x.device, float("-inf")
    col = lambda vs: torch.tensor(vs, dtype=x.dtype, device=dev).view(S, 1)  # noqa: E731
    t = col(temps)
    vals = x.gather(-1, ids) / t
    vals_s, order = vals.masked_fill(~cand, ninf).sort(dim=-1, descending=True, stable=True)
    cand_s = cand.gather(-1, order)
    probs = (vals_s - m).exp() / total
    before = probs.cumsum(-1) - probs  # mass strictly above each candidate
    keep = cand_s & (before < col([q.top_p if q.top_p < 1.0 else math.inf for q in qs]))
    if any(q.min_p > 0 for q in qs):
        mp = col([q.min_p for q in qs])
        probs2 = vals_s.masked_fill(~keep, ninf).softmax(-1)
        keep &= ~((mp > 0) & (probs2 < probs2.max(-1, keepdim=True).values * mp))
    ok = (cand_s & ~keep & (vals_s > c / t)).any(-1)
    # Draw over the kept candidates in id order, as the reference's cumsum runs.
    keep_by_id = torch.empty_like(keep).scatter_(-1, order, keep)
    at = inverse_cdf(vals.masked_fill(~keep_by_id, ninf).softmax(-1), u)
    return ids.gather(-1, at.view(S, 1)).view(S), ok


def _window_draw(x: torch.Tensor, q: SamplingParams, u: torch.Tensor) -> torch.Tensor:
    """One row's token (x [V], top-k already applied) by the reference's filters and draw,
    with the top-p cut found by :func:`top_p_kept` instead of a sort of the row; the
    reference's sort only when that misses."""
    ninf = float("-inf")
    if q.top_p < 1.0:
        kept = top_p_kept(x, q.top_p) if bool(torch.isfinite(x.amax())) else None
        if kept is None:
            plain = replace(q, temperature=1.0, repetition_penalty=1.0, logit_bias={}, top_k=0)
            return inverse_cdf(filter_rows(x.view(1, -1), [plain], [None]).softmax(-1), u.view(1))[0]
        x = x.masked_fill(~kept, ninf)
    return inverse_cdf(min_p_filter(x, q.min_p).view(1, -1).softmax(-1), u.view(1))[0]


def top_p_kept(x: torch.Tensor, p: float, tries: int = 4) -> torch.Tensor | None:
    """top_p_filter's kept tokens of one row x [V] (bool [V]), sorting only a window.

    A strided sample of the row, sorted, estimates where the mass above a value reaches
    p; the window is the values between two sample values around that rank. Tokens above
    the window are kept (their mass is summed once), the window alone is sorted, and its
    tokens get the reference's ``before < p`` test (its cumsum accumulates in float64,
    as the reference's does on CPU). The cut is exact when the window's first token is
    kept (or nothing lies above) and its last is dropped (or nothing lies below);
    otherwise the window moves that way, wider, up to ``tries`` times. None when it
    never fits, or when a window token's ``before`` is within ROUNDING of p.
    """
    V = x.numel()
    probs = x.softmax(-1)
    stride = max(1, V // SAMPLE)
    sx = x[::stride].sort(descending=True).values
    mass = (sx - sx[0]).exp().cumsum(0)  # an estimate: exact sums come below
    n = sx.numel()
    at = int(torch.searchsorted(mass, mass[-1:] * p))
    half = int(3 * math.sqrt(at * (n - at) / n)) + 4  # three standard deviations of a sampled rank
    top, bottom = at - half, at + half
    for _ in range(tries):
        hi = sx[top] if top > 0 else None  # the window: hi > x >= lo
        lo = sx[bottom] if bottom < n else None
        window = between(x, lo, hi)
        if window.numel():
            w_vals, order = x.index_select(0, window).sort(descending=True, stable=True)
            w_idx = window.index_select(0, order)
            w_probs = probs.index_select(0, w_idx)
            above = x >= hi if hi is not None else torch.zeros(V, dtype=torch.bool, device=x.device)
            # the mass above the window in float64: a float32 dot over 128k entries drifts by
            # ~1e-6 with one thread, enough to put the cut's rounding band in the wrong place
            start = float(probs.masked_select(above).double().sum()) if hi is not None else 0.0
            before = (start + w_probs.double().cumsum(0)).to(x.dtype) - w_probs
            keep = before < p
            first, last = hi is None or bool(keep[0]), lo is None or not bool(keep[-1])
            if first and last:
                if bool(((before - p).abs() <= ROUNDING).any()):
                    return None  # the reference's own rounding decides: only its sort can tell
                return above.index_fill(0, w_idx[keep], True)
        else:  # no value between hi and lo (ties at both ends): widen both ways
            first = last = None
        width = 2 * (bottom - top)
        if first is None:
            top, bottom = top - width, bottom + width
        elif not first:
            top, bottom = top - width, top
        else:
            top, bottom = bottom, bottom + width
        top, bottom = max(top, 0), min(bottom, n)
    return None


def filtered_row(row: torch.Tensor, q: SamplingParams, previous: torch.Tensor | None) -> torch.Tensor:
    """filter_logits(row, q, previous) for one row [V] without sorting it: top-p's cut
    from :func:`top_p_kept`, the reference's sort only where that defers."""
    x = _prepared(row.view(1, -1), [q], [previous], None)[0]
    if q.greedy:
        return x
    x = top_k_filter(_tempered(x, q.temperature), q.top_k)
    if q.top_p < 1.0:
        kept = top_p_kept(x, q.top_p) if bool(torch.isfinite(x.amax())) else None
        x = top_p_filter(x, q.top_p) if kept is None else x.masked_fill(~kept, float("-inf"))
    return min_p_filter(x, q.min_p)


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None,
           previous: torch.Tensor | None = None) -> int:
    """Choose one token from logits [V]."""
    filtered = filter_logits(logits, params, previous)
    if params.greedy:
        return int(filtered.argmax())
    return draw(filtered.softmax(-1), generator)


def top_alternatives(logits: torch.Tensor, params: SamplingParams, previous: torch.Tensor | None = None,
                     k: int = 5, filtered: torch.Tensor | None = None, allowed: torch.Tensor | None = None) -> dict:
    """Probabilities of the top-k tokens before and after this request's filters.

    Args:
        filtered: filter_logits(logits, params, previous) when the caller has it already.
        allowed: bool [V], the tokens the lane's constraint allows (None: no constraint).

    Returns:
        {"raw": [(id, prob)...], "filtered": [(id, prob)...]} for a token inspector, and
        with a constraint "constrained": the raw top-k ids the constraint removed.
    """
    raw = logits.float().softmax(-1)
    if filtered is not None:
        filt_logits = filtered
    else:
        src = logits.float() if allowed is None else logits.float().masked_fill(~allowed, float("-inf"))
        filt_logits = filtered_row(src, params, previous)
    if params.greedy:
        filt = torch.zeros_like(raw)
        filt[filt_logits.argmax()] = 1.0
    else:
        filt = filt_logits.softmax(-1)
    def top(p):
        v, i = torch.topk(p, min(k, p.numel()))
        return [(int(a), float(b)) for a, b in zip(i, v) if b > 0]
    out = {"raw": top(raw), "filtered": top(filt)}
    if allowed is not None:
        out["constrained"] = [i for i, _ in out["raw"] if not bool(allowed[i])]
    return out
