"""The event vocabulary: what generation says, in order, about a request.

``Prefilled`` (the prompt ran), then per lane ``Token`` after ``Token`` and one ``Done``
(with its ``Stats``). The engine yields them; the worker wraps each in a ``Reply`` tagged
with its request id; the HTTP client builds the same events from a server's stream, so the
GUI and the CLI draw local and remote replies alike. Torch-free on purpose: the client,
the server's response shaping and the GUI import this without importing torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from core.engine.settings import SamplingParams
from core.tools.spec import ToolCall

# "tool_calls": the reply ended (on a stop token) after calling tools: Done.tool_calls.
STOP_REASONS = ("eos", "stop", "length", "context", "cancelled", "error", "tool_calls")


@dataclass
class Prefilled:
    """The prompt has been run: ``prompt_tokens`` in all, ``cached_tokens`` reused.

    ``lanes`` are the lanes that share this prompt (one request of a batch).
    """
    prompt_tokens: int
    cached_tokens: int
    seconds: float
    lanes: tuple[int, ...] = ()


@dataclass
class Token:
    """One generated token of one lane.

    ``text`` is what to append to the visible reply (it may be empty while a UTF-8
    character or a possible stop string is incomplete); ``piece`` is this token's own
    text for display; ``logprob`` is under the model's raw distribution.
    """
    lane: int
    index: int
    token_id: int
    text: str
    piece: str
    logprob: float
    top: dict | None = None  # raw / filtered alternatives when inspection is on


@dataclass
class Stats:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    ttft_s: float = 0.0
    warmup_s: float = 0.0  # decode steps that compiled or recorded a graph (not in decode_s)
    decode: str = ""  # the compiled decode path that ran, when compiling was asked (compile_status)
    speculative: dict | None = None  # drafted/accepted counts and speed-up (lanes that draft)

    @property
    def prefill_tok_s(self) -> float:
        n = self.prompt_tokens - self.cached_tokens
        return n / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        # The first token comes from the prefill's logits; decode made the rest.
        n = max(self.generated_tokens - 1, 0)
        return n / self.decode_s if self.decode_s > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
            "generated_tokens": self.generated_tokens, "prefill_s": self.prefill_s,
            "decode_s": self.decode_s, "ttft_s": self.ttft_s,
            "prefill_tok_s": self.prefill_tok_s, "decode_tok_s": self.decode_tok_s,
            **({"warmup_s": self.warmup_s} if self.warmup_s else {}),
            **({"decode": self.decode} if self.decode else {}),
            **({"speculative": dict(self.speculative)} if self.speculative is not None else {}),
        }


@dataclass
class Beam:
    """One hypothesis a beam search returned: its tokens and text, each token's log-prob,
    its score (summed log-prob / length ** length_penalty), why it ended and the stop
    token that ended it (None when it ran out of length)."""
    tokens: list[int]
    text: str
    logprobs: list[float]
    score: float
    stop_reason: str
    stop_token: int | None = None


@dataclass
class Done:
    """A lane finished; ``stop_reason`` is one of STOP_REASONS; for "error", ``error``
    says why in one line. A beam search's Done is its best hypothesis, and ``beams`` holds
    every hypothesis it returned (up to num_beams), best first: the first is this one.
    "tool_calls": ``tool_calls`` are the calls the reply made (``text`` is what the model
    wrote for them); a call the model got wrong (constraint off) has its ``error`` set."""
    lane: int
    stop_reason: str
    tokens: list[int]
    text: str
    logprobs: list[float]
    params: SamplingParams
    stats: Stats
    stop_token: int | None = None
    error: str = ""
    prompt_ids: list[int] | None = None  # a server's reply: its prompt as the server tokenized it
    beams: list[Beam] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)


Event = Prefilled | Token | Done


@dataclass
class Reply:
    """One of the engine's own events (Prefilled, Token or Done) of request ``request_id``."""
    request_id: int
    event: Event
