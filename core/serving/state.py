"""What the server serves: one loaded model, its engine, and the scheduler over it."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from core.engine.engine import Engine
from core.engine.settings import SCHEMA
from core.errors import SettingsError
from core.serving.metrics import Metrics
from core.serving.scheduler import Job, Scheduler
from core.tokenizer.fingerprint import tokenizer_fingerprint
from core.worker.worker import draft_loader


class ServerState:
    """What the app serves: one loaded model behind a scheduler.

    ``lookup``: requests' default prompt lookup (0: off). ``draft``: a draft model's path,
    loaded now by the app's own draft loader and listed by its name; requests draft with it
    by default (DraftModelError when its vocabulary differs from the model's, a
    CheckpointError when it cannot be read). Requests never load models of their own.
    ``compile``: decode through torch.compile (``serve --compile``; :mod:`core.model.decode_step`).
    ``threads``: the engine's (prefill, decode) torch threads (:func:`core.model.tuning.thread_plan`).
    ``prep``: the threads that read, parse and tokenize requests and build their sampling
    settings, off the event loop (:func:`core.serving.app.prepare`).
    """

    def __init__(self, loaded, *, model_id: str | None = None, aliases: tuple[str, ...] = (), any_model: bool = False,
                 api_key: str | None = None,
                 max_batch: int = 16, max_queue: int = 64, on_done: Callable[[Job], None] | None = None,
                 lookup: int = 0, draft: str | None = None, compile: bool | str = False,
                 threads: tuple[int, int] | None = None):
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.model_id = model_id or loaded.name
        # every name a request may give (replies say the first); any_model: whatever it gives
        self.model_names = tuple(dict.fromkeys((self.model_id, *aliases)))
        self.any_model = any_model
        self.api_key = api_key or None
        self.engine = Engine(loaded.model, loaded.tokenizer, stop_ids=loaded.stop_ids, compile=compile,
                             threads=threads)
        self.prep = ThreadPoolExecutor(2, thread_name_prefix="llamadesk-prep")
        self.metrics = Metrics()
        self.draining = False  # told to stop: running requests finish, new ones get 503
        self.max_prompt_bytes = self.engine.max_context * longest_token(loaded.tokenizer, loaded.model.args.vocab_size)
        if not isinstance(lookup, int) or not SCHEMA["lookup"].accepts(lookup):
            raise SettingsError(SCHEMA["lookup"].error(lookup, "--lookup"))
        if lookup and draft:
            raise SettingsError("choose --lookup or --draft, not both")
        self.lookup, self.draft = int(lookup), ""
        if draft:
            self.draft = draft_loader(self.engine, named=True)(draft).name
        self.scheduler = Scheduler(self.engine, max_batch=max_batch, max_queue=max_queue, on_done=on_done)
        info = loaded.info
        self.fingerprint = "fp_llamadesk_" + "_".join(
            str(info.get(k, "?")) for k in ("dtype", "device")).replace(":", "")
        self.created = int(time.time())

    def close(self) -> None:
        """Stop the scheduler and the request threads (the app's lifespan ends with this)."""
        self.scheduler.stop()
        self.prep.shutdown(wait=False, cancel_futures=True)

    def model_card(self, name: str | None = None) -> dict:
        return {"id": name or self.model_id, "object": "model", "created": self.created, "owned_by": "llamadesk",
                "max_model_len": self.engine.max_context,
                "llamadesk": {"chat_format": self.loaded.chat_format.name, "vocab_size": self.loaded.model.args.vocab_size,
                              "tokenizer": tokenizer_fingerprint(self.tokenizer, self.loaded.model.args.vocab_size),
                              # the defaults of the lookup / draft request fields
                              "speculative": {"lookup": self.lookup, "draft": self.draft or None}}}


def longest_token(tokenizer, vocab: int) -> int:
    """The most bytes one token stands for (at least 4: an unknown character is one token):
    a text longer than the context times this cannot fit, whatever it tokenizes to."""
    most = 4
    for i in range(vocab):
        try:
            most = max(most, len(tokenizer.token_bytes(i)))
        except (KeyError, IndexError, ValueError):  # a padded row past the tokenizer's vocabulary
            continue
    return most
