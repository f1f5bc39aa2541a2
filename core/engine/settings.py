"""How a reply or a comparison lane is sampled: :class:`SamplingParams` and its limits.

Torch-free on purpose: the settings travel in requests, events, the HTTP client and the
GUI, none of which needs torch to say what was asked. The filters that apply them to
logits are :mod:`core.engine.sampling`.
"""
from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field, replace

from core.engine.constraint import Constraint
from core.errors import SettingsError


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
