"""The models comparison lanes run on, without Qt or torch.

A :class:`LaneModel` says where one lane runs (the app's loaded model, another checkpoint
the worker holds beside it, or a model on a server); a :class:`ModelShelf` is the list a
comparison window offers its lanes, and what it has learned of each vocabulary (token
ids to pieces) from the tokens that streamed.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit


def public_server(url: str) -> str:
    """A server's address fit to show and store: no user:password part, no query."""
    u = urlsplit(url)
    host = u.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return f"{u.scheme}://{host}{f':{u.port}' if u.port else ''}{u.path}"


def same_path(a: str, b: str) -> bool:
    try:
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
    except OSError:
        return False


@dataclass(eq=False)
class LaneModel:
    """Where a comparison lane runs: the model loaded in the app ("loaded"), another local
    checkpoint the worker holds beside it ("checkpoint", ``key`` names it), or a model on a
    connected server ("server", ``remote`` is its :class:`core.remote.client.RemoteModel`).

    ``tokenizer`` is the tokenizer's fingerprint (None: unknown, e.g. a server that does
    not say): lanes compare token ids only when theirs match.
    """
    kind: str
    name: str
    key: str = ""
    remote: object = None
    tokenizer: str | None = None
    path: str = ""
    dummy_prefix: bool = False  # SentencePiece: a word-start token's text drops its space to encode alone

    @property
    def server(self) -> str:
        # A saved lane's server that is not connected now keeps its address in ``path``.
        return public_server(self.remote.url) if self.remote is not None else self.path

    @property
    def group(self) -> tuple:
        """Lanes with the same group run as one request (one prefill, one batch)."""
        if self.kind == "server":
            return ("server", id(self.remote), self.path)
        return (self.kind, self.key or self.path)

    def label(self) -> str:
        """How the lane header names it."""
        if self.kind == "server":
            return f"{self.name} @ {urlsplit(self.server).netloc}"
        return self.name

    def tip(self) -> str:
        """The lane model combo's tooltip: where it runs and on which tokenizer."""
        where = {"loaded": "the model loaded in the app", "checkpoint": self.path or self.key,
                 "server": self.server}.get(self.kind, "")
        tok = f"tokenizer {self.tokenizer}" if self.tokenizer else "tokenizer not known"
        return f"{self.name} — {where} · {tok}"

    def record(self) -> dict:
        """What a saved or exported lane says about its model (never an API key)."""
        d: dict = {"kind": self.kind, "name": self.name, "tokenizer": self.tokenizer}
        if self.kind == "server":
            d["server"] = self.server
        elif self.path:
            d["path"] = self.path
        return d

    @property
    def takes_extensions(self) -> bool:
        """Takes a logit bias by text and speculative decoding: a local model, or a model on
        LlamaDesk's own serve (extension fields its engine runs); another server has
        neither, nor a tokenizer known here."""
        return self.kind != "server" or (self.remote is not None and self.remote.is_llamadesk)


def tokenizers_match(a: LaneModel, b: LaneModel) -> bool | None:
    """True when two lanes' token ids mean the same text, False when they do not, None
    when a side does not say."""
    if a is b or (a.group == b.group and a.kind != "server"):
        return True
    if a.tokenizer is None or b.tokenizer is None:
        return None
    return a.tokenizer == b.tokenizer


def loaded_model_from(info: dict | None) -> LaneModel:
    """The app's loaded model as a lane model (its bridge's ``model_info``)."""
    info = info or {}
    return LaneModel("loaded", str(info.get("name") or "Loaded model"), tokenizer=info.get("tokenizer"),
                     path=str(info.get("path") or ""), dummy_prefix=bool(info.get("dummy_prefix")))


class ModelShelf:
    """The models a comparison's lanes can run on (``models``, in the order offered; the
    first is the default) and the token pieces learned per tokenizer."""

    def __init__(self, models: list[LaneModel]):
        self.models = list(models)
        self._names: dict[str, dict[int, str]] = {}  # tokenizer -> id -> piece seen in its lanes

    def __iter__(self):
        return iter(self.models)

    def __contains__(self, model) -> bool:
        return model in self.models

    def loaded(self) -> LaneModel | None:
        return next((m for m in self.models if m.kind == "loaded"), None)

    def add(self, model: LaneModel) -> LaneModel:
        if model not in self.models:
            self.models.append(model)
        return model

    def follow_load(self, info: dict) -> None:
        """The app loaded another model: lanes on "the loaded model" now run on it."""
        fresh = loaded_model_from(info)
        for m in self.models:
            if m.kind == "loaded":
                m.name, m.tokenizer, m.path, m.dummy_prefix = fresh.name, fresh.tokenizer, fresh.path, fresh.dummy_prefix

    def known_checkpoint(self, path: str) -> LaneModel | None:
        """The loaded model or a held checkpoint that is ``path`` (no second copy of it)."""
        loaded = self.loaded()
        if loaded is not None and loaded.path and same_path(loaded.path, path):
            return loaded
        return next((m for m in self.models if m.kind == "checkpoint" and m.key and same_path(m.key, path)), None)

    def held(self, info: dict) -> LaneModel:
        """The lane model of a checkpoint the worker now holds (``bridge.hold``'s info)."""
        for m in self.models:
            if m.kind == "checkpoint" and (m.key == info["key"] or (not m.key and same_path(m.path, info["key"]))):
                m.key, m.tokenizer, m.name = info["key"], info.get("tokenizer"), str(info.get("name") or m.name)
                m.dummy_prefix = bool(info.get("dummy_prefix"))
                return m
        return self.add(LaneModel("checkpoint", str(info.get("name") or Path(info["key"]).name), key=info["key"],
                                  tokenizer=info.get("tokenizer"), path=str(info.get("path") or info["key"]),
                                  dummy_prefix=bool(info.get("dummy_prefix"))))

    def server(self, remote) -> LaneModel:
        """A connected :class:`core.remote.client.RemoteModel` as a lane model (once per
        server and model)."""
        for m in self.models:
            if m.kind == "server" and m.remote is not None and m.remote.url == remote.url and m.name == remote.model:
                m.remote = remote
                m.tokenizer = remote.tokenizer_fingerprint
                return m
        return self.add(LaneModel("server", str(remote.model), remote=remote, tokenizer=remote.tokenizer_fingerprint))

    def from_record(self, rec) -> LaneModel:
        """The open model a saved lane ran on, or a stand-in that says what to open (a
        checkpoint is opened again at Run; a server must be connected again)."""
        loaded = self.loaded() or self.models[0]
        if not isinstance(rec, dict) or not rec.get("kind"):
            return loaded  # saved before lanes had models: the loaded one
        # A saved (or imported) record is data, not trusted: strings only, nothing opened or
        # connected until the user runs the lane.
        def text(key: str) -> str:
            v = rec.get(key)
            return v if isinstance(v, str) else ""
        name, kind, path, tok = text("name") or "?", text("kind"), text("path"), text("tokenizer") or None
        if kind == "server":
            for m in self.models:
                if m.kind == "server" and m.server == text("server") and m.name == name:
                    return m
            return LaneModel("server", name, tokenizer=tok, path=text("server"))
        for m in self.models:
            if m.name == name and (not path or not m.path or same_path(m.path, path)) and m.kind != "server":
                return m
        if path:
            return self.add(LaneModel("checkpoint", name, tokenizer=tok, path=path))
        return loaded

    def names_for(self, model: LaneModel) -> dict[int, str]:
        """id -> piece learned from the tokens of lanes on ``model``'s tokenizer."""
        return self._names.setdefault(model.tokenizer or repr(model.group), {})
