"""Token sampling: pure functions over logits plus a small settings object.

Every filter takes float32 logits [..., V] and returns logits with the removed tokens
set to -inf, so they compose in a fixed order: repetition penalty, temperature, top-k,
top-p, min-p. Randomness comes only from the request's own ``torch.Generator``.
"""
from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field, replace
from typing import Sequence

import numpy as np
import torch

from .constrain import Constraint
from .errors import SettingsError


GREEDY_TEMPERATURE = 1e-5  # temperatures below this behave as 0 (greedy)
# Outside these a penalty overflows float32 logits (1e-45 makes every seen token +inf).
MIN_PENALTY, MAX_PENALTY = 0.01, 1e6
MAX_LENGTH_PENALTY = 10.0
MAX_LOOKUP = 8  # longest n-gram prompt lookup matches  # beam scores divide by length ** penalty: 1e308 overflows
MAX_BIAS = 100.0  # a logit bias is within ±100 (OpenAI's range), or -inf: never that token


@dataclass
class SamplingParams:
    """How one reply (or one comparison lane) is sampled.

    temperature 0 (or below 1e-5) means greedy; top_k 0, top_p 1, min_p 0 and repetition_penalty 1 are
    off. seed None draws a fresh seed, which :meth:`resolved` records so the reply can
    be reproduced.
    """

    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    num_beams: int = 1
    length_penalty: float = 1.0
    # Speculative decoding changes the speed, never the distribution: lookup N drafts by
    # matching the last N (down to 1) tokens earlier in the context; draft names a smaller
    # model with the same vocabulary (a path). 0 / "" is off.
    lookup: int = 0
    draft: str = ""
    constraint: Constraint | None = None  # JSON schema / regex / grammar the output must match
    # Added to the raw logits before every filter: token id -> bias (-inf bans the token).
    logit_bias: dict[int, float] = field(default_factory=dict)
    # The same by text, "TEXT=BIAS" each: the engine splits TEXT with its model's tokenizer
    # (:meth:`with_text_bias`), so a lane on another checkpoint gets that vocabulary's ids.
    logit_bias_text: tuple[str, ...] = ()

    KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed",
            "max_new_tokens", "num_beams", "length_penalty", "lookup", "draft")

    def __post_init__(self) -> None:
        self.stop = tuple(self.stop)
        self.logit_bias_text = tuple(self.logit_bias_text)
        if self.logit_bias:  # JSON keeps ids as strings; "-inf" as text stays readable there
            try:
                self.logit_bias = {int(k): float(v) for k, v in dict(self.logit_bias).items()}
            except (TypeError, ValueError):
                raise SettingsError(f"logit_bias maps token ids to numbers, got {self.logit_bias!r}") from None
        if isinstance(self.constraint, dict):
            self.constraint = Constraint.from_value(self.constraint)

    def validate(self) -> "SamplingParams":
        """Raise SettingsError naming the first invalid setting; return self."""
        def bad(msg: str):
            raise SettingsError(msg)
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)) or self.temperature < 0:
            bad(f"temperature must be 0 or more, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            bad(f"top_p must be in (0, 1], got {self.top_p}")
        if int(self.top_k) != self.top_k or self.top_k < 0:
            bad(f"top_k must be a whole number ≥ 0, got {self.top_k}")
        if not 0 <= self.min_p < 1:
            bad(f"min_p must be in [0, 1), got {self.min_p}")
        if not (isinstance(self.repetition_penalty, (int, float)) and
                MIN_PENALTY <= self.repetition_penalty <= MAX_PENALTY):
            bad(f"repetition_penalty must be between {MIN_PENALTY} and {MAX_PENALTY:g}, got {self.repetition_penalty}")
        if not (isinstance(self.length_penalty, (int, float)) and -MAX_LENGTH_PENALTY <= self.length_penalty
                <= MAX_LENGTH_PENALTY):
            bad(f"length_penalty must be between -{MAX_LENGTH_PENALTY:g} and {MAX_LENGTH_PENALTY:g}, "
                f"got {self.length_penalty}")
        if int(self.max_new_tokens) != self.max_new_tokens or self.max_new_tokens < 1:
            bad(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if int(self.num_beams) != self.num_beams or not 1 <= self.num_beams <= 16:
            bad(f"num_beams must be between 1 and 16, got {self.num_beams}")
        if self.seed is not None and (int(self.seed) != self.seed or not 0 <= self.seed < 2**63):
            bad(f"seed must be a whole number ≥ 0, got {self.seed}")
        if any(not s for s in self.stop):
            bad("stop strings must not be empty")
        if (isinstance(self.lookup, bool) or not isinstance(self.lookup, (int, float))
                or not math.isfinite(self.lookup) or int(self.lookup) != self.lookup
                or not 0 <= self.lookup <= MAX_LOOKUP):
            bad(f"lookup must be a whole number from 0 (off) to {MAX_LOOKUP}, got {self.lookup!r}")
        if not isinstance(self.draft, str):
            bad(f"draft must be a model's path, got {self.draft!r}")
        if self.lookup and self.draft:
            bad("choose prompt lookup or a draft model, not both")
        if self.speculative and self.num_beams > 1:
            bad("speculative decoding (lookup or draft) does not combine with beam search")
        for spec in self.logit_bias_text:
            parse_logit_bias(spec, lambda text: [0])  # the form only; ids come from the model
        if (self.logit_bias or self.logit_bias_text) and self.num_beams > 1:
            bad("a logit bias does not combine with beam search")
        for tok, b in self.logit_bias.items():
            if tok < 0:
                bad(f"logit_bias: token id {tok} is negative")
            if not (b == -math.inf or (math.isfinite(b) and -MAX_BIAS <= b <= MAX_BIAS)):
                bad(f"logit_bias for token {tok} must be between -{MAX_BIAS:g} and {MAX_BIAS:g} (or -inf), got {b}")
        if self.constraint is not None:
            Constraint.from_value(self.constraint).validate()
            if self.num_beams > 1:
                bad("a constraint (JSON schema, regex or grammar) cannot be combined with beam search")
        return self

    @property
    def speculative(self) -> bool:
        """Whether this lane drafts tokens (prompt lookup or a draft model)."""
        return bool(self.lookup or self.draft)

    @property
    def greedy(self) -> bool:
        # Below GREEDY_TEMPERATURE, logits / temperature overflow float32 to inf and the
        # softmax turns to NaN; greedy is what such a temperature means anyway.
        return self.temperature < GREEDY_TEMPERATURE

    def resolved(self) -> "SamplingParams":
        """A copy with a concrete seed (drawn now if None)."""
        if self.seed is not None:
            return self
        return replace(self, seed=random.SystemRandom().randrange(2**31))

    def generator(self, device: torch.device | str = "cpu") -> torch.Generator:
        """A generator seeded with this request's seed, on ``device``."""
        g = torch.Generator(device=device)
        g.manual_seed(int(self.resolved().seed))
        return g

    def with_text_bias(self, encode) -> "SamplingParams":
        """A copy whose logit_bias also holds logit_bias_text's tokens (``encode``: the
        model's tokenizer, plain text); ids given directly win over text."""
        if not self.logit_bias_text:
            return self
        bias: dict[int, float] = {}
        for spec in self.logit_bias_text:
            bias.update(parse_logit_bias(spec, encode))
        return replace(self, logit_bias={**bias, **self.logit_bias})

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stop"] = list(self.stop)
        d["logit_bias_text"] = list(self.logit_bias_text)
        d["logit_bias"] = {str(k): (v if math.isfinite(v) else str(v)) for k, v in self.logit_bias.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "SamplingParams":
        known = set(cls.__dataclass_fields__)
        kw = {k: v for k, v in d.items() if k in known}
        if "stop" in kw:
            kw["stop"] = tuple(kw["stop"])
        if "logit_bias_text" in kw:
            kw["logit_bias_text"] = tuple(kw["logit_bias_text"] or ())
        if kw.get("constraint") is not None:
            kw["constraint"] = Constraint.from_value(kw["constraint"])
        return cls(**kw)


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
    core.constrain), or None for no constraint. Applied before every other filter.
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
    dev = logits.device
    return logits.index_put((torch.tensor(rows, device=dev), torch.tensor(toks, device=dev)),
                            torch.tensor(bias, dtype=logits.dtype, device=dev), accumulate=True)


def parse_logit_bias(spec: str, encode) -> dict[int, float]:
    """``TEXT=BIAS`` (e.g. ``' cat=+5'``, ``'Once=-inf'``) as {token id: bias}: every token
    of TEXT, as ``encode(text)`` gives them (plain text: never special tokens), gets BIAS.

    Raises SettingsError for a spec without '=', an empty text or a bad number.
    """
    text, eq, value = spec.rpartition("=")
    if not eq or not text:
        raise SettingsError(f"bad logit bias {spec!r}: use TEXT=BIAS, e.g. 'cat=+5' or 'cat=-inf'")
    try:
        bias = float(value.strip())
    except ValueError:
        raise SettingsError(f"bad logit bias {spec!r}: {value.strip()!r} is not a number (or -inf)") from None
    if not (bias == -math.inf or (math.isfinite(bias) and -MAX_BIAS <= bias <= MAX_BIAS)):
        raise SettingsError(f"bad logit bias {spec!r}: use a number between -{MAX_BIAS:g} and {MAX_BIAS:g}, or -inf")
    ids = list(encode(text))
    if not ids:
        raise SettingsError(f"bad logit bias {spec!r}: the text has no tokens")
    return {int(t): bias for t in ids}


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from probabilities [V] by inverse CDF: one uniform from ``generator``.

    torch.multinomial costs ~1 ms for a 32k vocabulary on CPU; this ~0.05 ms.
    """
    u = torch.rand((), generator=generator, dtype=probs.dtype, device=probs.device)
    return int(_inverse_cdf(probs.unsqueeze(0), u.view(1))[0])


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Row-wise: the first index whose cumulative mass exceeds u [B] times the row's total."""
    cdf = probs.cumsum(-1)
    # right=True: the first token whose cumulative mass exceeds u, never a zero-mass one.
    at = torch.searchsorted(cdf, (u * cdf[:, -1]).view(-1, 1), right=True)
    return at.view(-1).clamp_max(probs.shape[-1] - 1)


CANDIDATES = 256  # tokens the fast sampler looks at first (then 16x that, then the whole row)


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

    The same tokens as filter_rows + argmax/draw with the same generators: sampled rows
    take their ``candidates`` largest logits (ties ordered by id, as the stable reference
    sort does), run top-k/top-p/min-p on those against the whole row's softmax mass, and
    draw with one uniform per row. A row whose kept set might reach past the candidates
    (top-p mass not reached, ties at the edge, no filter at all) is redone by the
    reference on the same uniform. The device is read once (ids, log-probs, flags).

    Args:
        logits: float32 [B, V]; previous: token ids per row for the repetition penalty.
        flags: optional bool [B] on the device (the engine's "row was finite"), read back
            in the same transfer as the ids so a step costs one host synchronisation.
        bitmask: the step's constraint masks (:func:`apply_bitmask`), applied first; the
            log-probs stay those of the raw distribution.
    """
    B, V = logits.shape
    dev = logits.device
    masked = apply_logit_bias(apply_bitmask(logits, bitmask), params)
    x_all = masked
    for i, (q, prev) in enumerate(zip(params, previous)):
        if prev is not None and q.repetition_penalty != 1.0 and prev.numel():
            if x_all is logits:
                x_all = logits.clone()
            x_all[i] = apply_repetition_penalty(masked[i], prev, q.repetition_penalty)
    # One division for all rows; dividing by 1.0 (greedy or untempered rows) is exact.
    temps = [q.temperature if not q.greedy and q.temperature != 1.0 else 1.0 for q in params]
    if any(t != 1.0 for t in temps):
        x_all = x_all / torch.tensor(temps, dtype=logits.dtype, device=dev).view(B, 1)
    sampled = [i for i, q in enumerate(params) if not q.greedy]
    if len(sampled) < B:  # greedy rows: the reference's argmax, first of ties
        tokens = x_all.argmax(-1)
    else:
        tokens = torch.zeros(B, dtype=torch.long, device=dev)
    ok = torch.ones(0, dtype=torch.bool, device=dev)
    if sampled:
        u = torch.stack([torch.rand((), generator=generators[i], dtype=logits.dtype, device=dev)
                         for i in sampled])
        sel = torch.tensor(sampled, device=dev)
        x = x_all if len(sampled) == B else x_all.index_select(0, sel)  # [S, V]
        qs = [params[i] for i in sampled]
        K = min(V, max(candidates, max(q.top_k for q in qs) + 1))
        wide = min(V, 16 * K)
        if K < V:
            fast, ok, widen = _candidate_draw(x, qs, u, K, wide)
            tokens = fast if len(sampled) == B else tokens.index_copy(0, sel, fast)
        else:
            ok = widen = torch.zeros(len(sampled), dtype=torch.bool, device=dev)
    else:
        widen = ok
    lse = logits.logsumexp(-1)
    logprob = logits.gather(-1, tokens.view(B, 1)).view(B) - lse
    S = ok.numel()
    F = 0 if flags is None else B
    parts = [tokens.double(), logprob.double()] + ([] if flags is None else [flags.double()])
    read = torch.cat(parts + [ok.double(), widen.double()]).tolist()
    ids, lps = [int(t) for t in read[:B]], read[B:2 * B]
    flag_list = None if flags is None else [bool(f) for f in read[2 * B:2 * B + F]]
    read = read[:2 * B] + read[2 * B + F:]
    bad = [k for k, good in enumerate(read[2 * B:2 * B + S]) if not good]
    if bad:  # a wider candidate pass where it can succeed, else the reference; same uniforms
        rb = torch.tensor(bad, device=dev)
        xb, ub, qb = x.index_select(0, rb), u.index_select(0, rb), [qs[k] for k in bad]
        slow = torch.zeros_like(rb)
        ok2 = torch.zeros(len(bad), dtype=torch.bool, device=dev)
        if wide < V and any(read[2 * B + S + k] for k in bad):
            slow, ok2, _ = _candidate_draw(xb, qb, ub, wide, wide)
        if not bool(ok2.all()):
            # x is already penalized and tempered: the reference must not do either again.
            again = [replace(q, temperature=1.0, repetition_penalty=1.0, logit_bias={}) for q in qb]
            ref = _inverse_cdf(filter_rows(xb, again, [None] * len(bad)).softmax(-1), ub)
            slow = torch.where(ok2, slow, ref)
        tokens = tokens.index_copy(0, sel.index_select(0, rb), slow)
        logprob = logits.gather(-1, tokens.view(B, 1)).view(B) - lse
        read = torch.cat([tokens.double(), logprob.double()]).tolist()
        ids, lps = [int(t) for t in read[:B]], read[B:]
    return Choice(tokens, ids, lps, flag_list)


def _candidate_draw(x: torch.Tensor, qs: Sequence[SamplingParams], u: torch.Tensor, K: int, wide: int):
    """Filters and the draw on each row's K largest logits.

    Returns:
        (tokens [S], exact [S], widen [S]): widen says whether ``wide`` candidates could
        be exact where K were not (top-p rows whose mass cannot reach p even with ``wide``
        tokens each as likely as the K-th go straight to the reference).
    """
    S, V = x.shape
    dev, ninf = x.device, float("-inf")
    top_vals, top_idx = torch.topk(x, K, dim=-1)  # the K-th value is top_vals[:, -1]
    # The reference's stable descending sort orders ties by id: sort by id, then stably by value.
    idx, _ = top_idx.sort(-1)
    vals = x.gather(-1, idx)
    vals_s, order = vals.sort(dim=-1, descending=True, stable=True)
    edge = top_vals[:, -1:]  # tokens outside the candidates are all <= edge
    col = lambda vs, dt=x.dtype: torch.tensor(vs, dtype=dt, device=dev).view(S, 1)  # noqa: E731
    k = col([q.top_k if 0 < q.top_k < V else 0 for q in qs], torch.long)
    kth = torch.where(k > 0, top_vals.gather(-1, (k - 1).clamp_min(0)), ninf)
    # top-k keeps ties at the k-th value, even past the candidates; forbidden (-inf) never
    keep = (vals_s >= kth) & (vals_s > ninf)
    # Top-p needs the softmax mass of the whole top-k filtered row; computed as softmax
    # does (exp of the gap to the max, over the sum) so exact cases round the same way.
    top = top_vals[:, :1]
    within = x.masked_fill(x < kth, ninf) if any(0 < q.top_k < V for q in qs) else x
    total = (within - top).exp().sum(-1, keepdim=True)
    masked = vals_s.masked_fill(~keep, ninf)
    probs = (masked - top).exp() / total
    # Tokens past the candidates are each at most as likely as the edge candidate.
    p_edge = (edge - top).exp().view(S) / total.view(S)
    reach = probs.sum(-1) + (wide - K) * p_edge
    p = col([q.top_p if q.top_p < 1.0 else math.inf for q in qs])
    before = probs.cumsum(-1) - probs
    keep &= before < p
    mp = col([q.min_p for q in qs])
    probs2 = masked.masked_fill(~keep, ninf).softmax(-1)
    keep &= ~((mp > 0) & (probs2 < probs2.max(-1, keepdim=True).values * mp))
    # Exact only if nothing kept sits at the edge value (ties or more mass may lie outside).
    ok = ~(keep & (vals_s <= edge)).any(-1)
    # Draw over the kept candidates in id order, as the reference's cumsum runs.
    keep_by_id = torch.empty_like(keep).scatter_(-1, order, keep)
    pr = vals.masked_fill(~keep_by_id, ninf).softmax(-1)
    at = _inverse_cdf(pr, u)
    no_filter = torch.tensor([q.top_p >= 1.0 and q.min_p <= 0 and not 0 < q.top_k < V for q in qs], device=dev)
    widen = ~no_filter & ((p.view(S) > 1.0) | (reach >= p.view(S)))
    return idx.gather(-1, at.view(S, 1)).view(S), ok, widen


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
        filt_logits = filter_logits(src, params, previous)
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
