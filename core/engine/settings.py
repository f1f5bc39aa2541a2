"""How a reply or a comparison lane is sampled: :class:`SamplingParams` and its limits.

Torch-free on purpose: the settings travel in requests, events, the HTTP client and the
GUI, none of which needs torch to say what was asked. The filters that apply them to
logits are :mod:`core.engine.sampling`.
"""
from __future__ import annotations

import math
import random
import re
from dataclasses import asdict, dataclass, field, replace

from core.engine.constraint import Constraint
from core.errors import SettingsError


_TOOL_CHOICE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # a word or a tool's name (OpenAI's names)
GREEDY_TEMPERATURE = 1e-5  # temperatures below this behave as 0 (greedy)
# Outside these a penalty overflows float32 logits (1e-45 makes every seen token +inf).
MIN_PENALTY, MAX_PENALTY = 0.01, 1e6
MAX_LENGTH_PENALTY = 10.0  # beam scores divide by length ** penalty: 1e308 overflows
MAX_LOOKUP = 8  # longest n-gram prompt lookup matches
MAX_BIAS = 100.0  # a logit bias is within ±100 (OpenAI's range), or -inf: never that token


# --------------------------------------------------------------------------- the schema

# Where a reply can run: this app's engine, LlamaDesk's serve, any OpenAI-compatible server
# (OpenAI's API itself: vLLM, Ollama, LM Studio take at least that), llama.cpp's server.
# A setting's ``backends`` are those known to honour it; a ``probed`` one goes to another
# server only where RemoteModel.probe saw that server honour it (vLLM's top_k, say).
LOCAL, LLAMADESK, OPENAI, LLAMA_CPP = "local", "llamadesk", "openai", "llama.cpp"
BACKENDS = (LOCAL, LLAMADESK, OPENAI, LLAMA_CPP)
_EVERYWHERE = frozenset(BACKENDS)
_LOCAL_ONLY = frozenset({LOCAL})
_APP = frozenset({LOCAL, LLAMADESK})  # this app's engine, here or behind serve


_BOOL_WORDS = {"on": True, "off": False, "true": True, "false": False, "1": True, "0": False,
               "yes": True, "no": False}


@dataclass(frozen=True)
class Setting:
    """One sampling setting, declared once; validation, CLI flags, serve's request fields,
    the settings panel's widgets, sweeps and lane specs are built from it.

    A numeric setting (``kind`` int or float) has an accepted range: ``lo``/``hi`` (None:
    unbounded), each inclusive unless ``lo_open``/``hi_open``. ``widget`` is the panel's
    range where the accepted one is wider than a control can usefully offer (a slider up to
    temperature 2, a spin box's 32-bit seed); it always lies inside the accepted range.
    ``step`` and ``decimals`` are the panel's; ``off`` is the value that turns it off.
    """

    name: str  # SamplingParams' field, serve's request field and a lane spec's key
    kind: type
    default: object
    label: str  # what a person calls it (panel rows, sweep choices)
    help: str  # one line: a CLI flag's help, a control's tooltip
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    step: float = 1
    decimals: int = 0
    widget: tuple[float, float] | None = None
    off: object = None
    optional: bool = False  # None is a value too (seed: draw a fresh one)
    backends: frozenset = _EVERYWHERE
    probed: bool = False  # sent to another OpenAI-compatible server only where its probe found it honoured
    api: str = ""  # serve's request field when it is not ``name`` (max_tokens)
    api_default: object = None  # serve's value for a field a request leaves out, where OpenAI's default differs
    api_off: object = None  # a request's own word for ``off`` (vLLM's top_k -1)
    flag: bool = False  # a flag of ``python -m core generate`` (and compare where it is every lane's default)
    panel: bool = False  # a control of the settings panel
    sweep: bool = False  # a comparison can sweep it
    lane: bool = False  # a comparison lane shows and stores it
    short: str = ""  # a lane's label where room is short ("T 0.7 · top-p 0.9"); the name by default

    @property
    def numeric(self) -> bool:
        return self.kind in (int, float)

    @property
    def request_field(self) -> str:
        """Its name in an OpenAI-style request (serve's, and what the client sends)."""
        return self.api or self.name

    @property
    def flag_name(self) -> str:
        return "--" + self.name.replace("_", "-")

    def _num(self, v) -> str:
        return f"{v:g}" if isinstance(v, float) else str(v)

    def range_text(self) -> str:
        """The accepted range in words: 'between 0 (exclusive) and 1', 'a whole number
        from 0 (off) to 8'."""
        lo, hi = self.lo, self.hi
        low = self._num(lo) + (" (off)" if self.off == lo and self.off is not None else "")
        if self.kind is int:
            return f"a whole number from {low} to {self._num(hi)}" if hi is not None else f"a whole number ≥ {low}"
        if hi is None:
            return f"above {low}" if self.lo_open else f"at least {low}"
        return (f"between {low}{' (exclusive)' if self.lo_open else ''} and "
                f"{self._num(hi)}{' (exclusive)' if self.hi_open else ''}")

    def error(self, value, name: str = "") -> str:
        shown = repr(value) if isinstance(value, str) else value
        return f"{name or self.name} must be {self.range_text()}, got {shown}"

    def accepts(self, value) -> bool:
        """Whether ``value`` is in the declared range (of the right kind; None where optional)."""
        if value is None:
            return self.optional
        if not self.numeric:
            return isinstance(value, self.kind)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        if self.kind is int and int(value) != value:
            return False
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            return False
        return self.hi is None or (value < self.hi if self.hi_open else value <= self.hi)

    def check(self, value, name: str = ""):
        """``value`` itself when accepted, else SettingsError naming ``name`` (this
        setting's own name by default: a CLI flag or request field may differ)."""
        if not self.accepts(value):
            raise SettingsError(self.error(value, name))
        return value

    def from_text(self, text: str):
        """A value typed as text (a CLI flag, a lane spec): ValueError when it is not a
        number of this kind (an int takes no fraction), SettingsError when out of range."""
        if self.kind is bool:
            word = text.strip().lower()
            if word not in _BOOL_WORDS:
                raise ValueError(f"{self.name} is on or off, got {text.strip()!r}")
            return _BOOL_WORDS[word]
        return self.check(self.kind(text.strip()) if self.numeric else text.strip())

    def widget_range(self) -> tuple[float, float]:
        """The panel control's (minimum, maximum): ``widget`` or the accepted range, an
        exclusive bound moved in by the control's smallest step."""
        if self.widget is not None:
            return self.widget
        tick = 10 ** -self.decimals if self.kind is float else 1
        return (self.lo + tick if self.lo_open else self.lo), (self.hi - tick if self.hi_open else self.hi)


SETTINGS: tuple[Setting, ...] = (
    Setting("temperature", float, 0.8, "Temperature",
            "Randomness of the reply: 0 always picks the likeliest token, higher is more varied.",
            lo=0.0, step=0.05, decimals=2, widget=(0.0, 2.0), api_default=1.0,
            flag=True, panel=True, sweep=True, lane=True, short="T"),
    Setting("top_p", float, 0.95, "Top-p",
            "Nucleus sampling: keep the likeliest tokens that together reach this probability (1 = off).",
            lo=0.0, hi=1.0, lo_open=True, step=0.01, decimals=2, off=1.0, api_default=1.0,
            flag=True, panel=True, sweep=True, lane=True, short="top-p"),
    Setting("top_k", int, 0, "Top-k", "Keep only the k likeliest tokens at each step (0 = off).",
            lo=0, widget=(0, 1000), off=0, api_off=-1, backends=frozenset({LOCAL, LLAMADESK, LLAMA_CPP}), probed=True,
            flag=True, panel=True, sweep=True, lane=True, short="top-k"),
    Setting("min_p", float, 0.0, "Min-p",
            "Drop tokens less likely than this fraction of the top token's probability (0 = off).",
            lo=0.0, hi=1.0, hi_open=True, step=0.01, decimals=2, off=0.0,
            backends=frozenset({LOCAL, LLAMADESK, LLAMA_CPP}), probed=True,
            flag=True, panel=True, sweep=True, lane=True, short="min-p"),
    # llama.cpp's server calls its own penalty repeat_penalty, so it ignores this field.
    Setting("repetition_penalty", float, 1.0, "Repetition penalty",
            "Above 1 discourages repeating tokens already in the text (1 = off).",
            lo=MIN_PENALTY, hi=MAX_PENALTY, step=0.05, decimals=2, widget=(0.5, 2.0), off=1.0,
            backends=_APP, probed=True, flag=True, panel=True, sweep=True, lane=True, short="rep"),
    Setting("seed", int, None, "Seed",
            "The random seed: the same seed and settings give the same reply (none: a fresh one each time).",
            lo=0, hi=2**63 - 1, widget=(0, 2**31 - 1), optional=True, probed=True,  # a spin box holds 32 bits
            flag=True, panel=True, sweep=True, lane=True),
    Setting("max_new_tokens", int, 256, "Max new tokens", "The most tokens one reply may have.",
            lo=1, step=32, widget=(1, 8192), api="max_tokens",
            flag=True, panel=True, sweep=True, lane=True, short="max"),
    Setting("num_beams", int, 1, "Beams",
            "Beam search over this many beams: the likeliest replies instead of a sampled one (1 = off: sampling).",
            lo=1, hi=16, off=1, backends=_LOCAL_ONLY, flag=True, panel=True, sweep=True, lane=True, short="beams"),
    Setting("length_penalty", float, 1.0, "Length penalty",
            "Beam search: scores divide by length ** penalty (above 0 favours longer beams).",
            lo=-MAX_LENGTH_PENALTY, hi=MAX_LENGTH_PENALTY, step=0.1, decimals=1, backends=_LOCAL_ONLY, flag=True,
            panel=True, sweep=True, lane=True, short="len-pen"),
    Setting("lookup", int, 0, "Prompt lookup",
            "Speculative decoding by prompt lookup: draft what followed the last n tokens earlier in the "
            "context (same reply, faster when it repeats the prompt).",
            lo=0, hi=MAX_LOOKUP, widget=(1, MAX_LOOKUP), off=0, backends=_APP,  # the panel's mode combo is "off"
            flag=True, panel=True, sweep=True, lane=True),
    Setting("draft", str, "", "Draft model",
            "Speculative decoding with a smaller draft model of the same vocabulary, a .gguf file or a "
            "model folder (same reply).", backends=_APP, flag=True, panel=True, sweep=True, lane=True),
    Setting("stop", tuple, (), "Stop at", "Stop the reply when it produces one of these strings.",
            flag=True, panel=True),
    # response_format reaches every server; regex and grammar fields LlamaDesk's and llama.cpp's.
    Setting("constraint", object, None, "Output format",
            "Hold the reply to a JSON schema, a regular expression or a grammar.", optional=True,
            flag=True, panel=True, sweep=True, lane=True, short="format"),
    Setting("logit_bias", dict, {}, "Logit bias by id",
            "Added to token ids' logits before the filters: -100 to 100, or -inf for never."),
    # Tool calling (issue 25): per lane, so a comparison can put constrained calls beside free
    # ones, or tool_choice auto beside required, on one prompt. Servers take tool_choice only.
    Setting("tool_choice", str, "auto", "Tool choice",
            "Whether the reply may call the declared tools: auto (the model decides), none, required, "
            "or a tool's name (that one); a comparison lane may also be off (the tools left out of its prompt).",
            flag=True, lane=True, short="tools"),
    Setting("tool_constraint", bool, True, "Constrained calls",
            "Hold a tool call to its tool's schema while the model writes it (off: see what it writes unaided).",
            backends=_APP, flag=True, lane=True, short="calls held"),
    Setting("logit_bias_text", tuple, (), "Logit bias",
            "Favour or ban words: TEXT=BIAS, BIAS (-100 to 100, or -inf: never) added to the logits of TEXT's "
            "tokens before the filters.", backends=_APP, flag=True, panel=True, sweep=True, lane=True, short="bias"),
)
SCHEMA: dict[str, Setting] = {s.name: s for s in SETTINGS}
NUMBERS = tuple(s for s in SETTINGS if s.numeric)


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
    # Where the request declares tools: auto / none / required / a tool's name, and whether
    # a call is held to its schema as it is written (the engine's call constraint).
    tool_choice: str = "auto"
    tool_constraint: bool = True

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
        for setting in NUMBERS:  # each number in its declared range (a seed may be None: drawn later)
            setting.check(getattr(self, setting.name))
        if any(not s for s in self.stop):
            bad("stop strings must not be empty")
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
        if not isinstance(self.tool_choice, str) or not _TOOL_CHOICE.match(self.tool_choice):
            bad(f"tool_choice must be auto, none, required or a tool's name, got {self.tool_choice!r:.80}")
        if not isinstance(self.tool_constraint, bool):
            bad(f"tool_constraint must be true or false, got {self.tool_constraint!r:.40}")
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
