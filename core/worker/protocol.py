"""What goes to the worker and what comes back: requests and the request-tagged events.

Torch-free, so the GUI, the remote runner (which answers the same requests from a server)
and tools build requests and read events without importing torch. The engine's own
events (Prefilled, Token, Done, Stats) and their request-tagged wrapper ``Reply`` are in
:mod:`core.engine.events`; :class:`core.worker.worker.Worker` runs the requests.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from core.engine.events import Reply
from core.engine.settings import SamplingParams
from core.tools.spec import Tool

MODES = ("chat", "completion")
MAX_INSPECT = 20


# --------------------------------------------------------------------------- requests

@dataclass
class PromptRequest:
    """What is prompted, shared by replies and comparisons.

    Chat mode renders ``messages`` with the model's chat format (or ``chat_format``, an
    override: auto | llama3 | llama2 | raw), dropping the oldest turns if the context is
    too small. Completion mode continues ``prompt`` (BOS + its text). ``continue_reply``
    carries on a chat reply that stopped on length: its text follows the assistant header
    with no end-of-turn (``messages`` must not contain it). ``inspect`` > 0 attaches the
    top-k alternatives to every token. A branch from a token of an earlier reply gives
    that reply's tokens before it as ``reply_prefix`` (they end the prompt, so the KV cache
    that still holds them is reused) and the chosen alternative as ``forced``. A branch of
    a reply that ran on a server also gives ``prompt_ids``, the prompt as that server
    tokenized it, and ``stop_ids`` (a chat reply's end of turn): the server is sent token
    ids, not messages (the local worker renders its own prompt and ignores both).

    ``tools`` are the functions a chat reply may call (each lane's ``tool_choice`` and
    ``tool_constraint`` say how); ``parallel_tool_calls`` lets one reply make several calls.
    Messages are in OpenAI's shape: an assistant's ``tool_calls``, ``tool`` results.
    """
    messages: list[dict] = field(default_factory=list)
    mode: str = "chat"
    prompt: str = ""
    chat_format: str = "auto"
    continue_reply: str = ""
    inspect: int = 0
    reply_prefix: list[int] = field(default_factory=list)
    forced: list[int] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    stop_ids: list[int] = field(default_factory=list)
    tools: list[Tool] = field(default_factory=list)
    parallel_tool_calls: bool = True

    @property
    def is_branch(self) -> bool:
        """A branch of an earlier reply: kept tokens, a forced one, or both (a ban keeps
        the tokens and forces none)."""
        return bool(self.forced or self.reply_prefix)


@dataclass
class GenerateRequest(PromptRequest):
    """One reply, sampled with ``params``."""
    params: SamplingParams = field(default_factory=SamplingParams)


@dataclass
class CompareRequest(PromptRequest):
    """One :class:`SamplingParams` per lane (1 to 8) over the same prompt.

    The prompt is prefilled once and every lane decodes in the same batch; events carry
    the lane index. ``model`` picks the checkpoint: "" the loaded model, else the key of
    one held beside it (:meth:`Worker.hold`).
    """
    lanes: list[SamplingParams] = field(default_factory=list)
    model: str = ""


@dataclass
class AttributeRequest(PromptRequest):
    """Where a span of a finished chat reply came from (:mod:`core.engine.attribution`).

    The prompt is rendered from the PromptRequest fields as for the reply; ``reply`` is the
    reply's text as shown and ``reply_ids`` its token ids when known (else the text is
    encoded). ``span`` is a character range of ``reply``; ``passages`` are character ranges
    of ``messages[source_message]``'s content (the grounded message and its source map).
    Answered by :class:`Attributed` (one share per passage) or Error.
    """
    reply: str = ""
    reply_ids: list[int] = field(default_factory=list)
    span: tuple[int, int] = (0, 0)
    passages: list[tuple[int, int]] = field(default_factory=list)
    source_message: int = -1


# --------------------------------------------------------------------------- events

@dataclass
class LoadProgress:
    request_id: int
    fraction: float
    stage: str


@dataclass
class Loaded:
    """A model is ready; ``info`` is the checkpoint's facts incl. "name" and "context_length".
    ``counter`` counts text in the model's tokens from any thread (a
    :class:`core.documents.chunk.TokenizerCounter`: documents are sized with it)."""
    request_id: int
    info: dict
    counter: Callable[[str], int] | None = None


@dataclass
class Held:
    """A second checkpoint is loaded beside the main model (:meth:`Worker.hold`); ``info``
    as :class:`Loaded`'s, plus "key" (what ``CompareRequest.model`` names) and "tokenizer"
    (its fingerprint: lanes whose fingerprints match can compare token ids)."""
    request_id: int
    info: dict


@dataclass
class Unloaded:
    """No model is loaded any more (explicit unload, or the old model dropped before a load)."""
    request_id: int


@dataclass
class Prompted:
    """The prompt is built: ``dropped_messages`` oldest turns were left out to fit the
    ``context_length``-token context. Comes before the request's first :class:`Reply`."""
    request_id: int
    dropped_messages: int
    context_length: int


@dataclass
class Counted:
    """The prompt a request makes for the loaded model is ``tokens`` long, of its
    ``context_length`` (:meth:`Worker.count`: nothing is generated)."""
    request_id: int
    tokens: int
    context_length: int


@dataclass
class Error:
    """A command failed; ``message`` is one line a user can read (never a traceback).

    ``cancelled`` is True when it failed because it was cancelled (nothing to show).
    ``kind`` is set by remote requests (core/remote.py): the :class:`core.remote.client.RemoteError`
    kind (connection, timeout, auth, rate_limit, busy, cut, ...); empty for local ones.
    """
    request_id: int
    message: str
    cancelled: bool = False
    kind: str = ""


@dataclass
class Attributed:
    """The answer to an :class:`AttributeRequest`: ``shares[i]`` of the span's attention went
    to passage i and ``none`` to the rest of the prompt and the reply so far (summed over
    ``layers`` x ``heads``, averaged over the span's ``tokens``)."""
    request_id: int
    shares: list[float]
    none: float
    layers: int
    heads: int
    tokens: int


WorkerEvent = Attributed | LoadProgress | Loaded | Held | Unloaded | Prompted | Counted | Reply | Error
