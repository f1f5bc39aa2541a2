"""What the server serves: one loaded model, its engine, and the scheduler over it."""
from __future__ import annotations

import time
from typing import Callable

from core.engine.engine import Engine
from core.engine.settings import SCHEMA
from core.errors import SettingsError
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
    """

    def __init__(self, loaded, *, model_id: str | None = None, api_key: str | None = None,
                 max_batch: int = 16, max_queue: int = 64, on_done: Callable[[Job], None] | None = None,
                 lookup: int = 0, draft: str | None = None, compile: bool | str = False):
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.model_id = model_id or loaded.name
        self.api_key = api_key or None
        self.engine = Engine(loaded.model, loaded.tokenizer, stop_ids=loaded.stop_ids, compile=compile)
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

    def model_card(self) -> dict:
        return {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "llamadesk",
                "max_model_len": self.engine.max_context,
                "llamadesk": {"chat_format": self.loaded.chat_format.name, "vocab_size": self.loaded.model.args.vocab_size,
                              "tokenizer": tokenizer_fingerprint(self.tokenizer, self.loaded.model.args.vocab_size),
                              # the defaults of the lookup / draft request fields
                              "speculative": {"lookup": self.lookup, "draft": self.draft or None}}}
