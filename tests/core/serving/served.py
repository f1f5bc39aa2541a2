"""A server on loopback for the serving tests: the server, an ``openai`` client for it, and
the same model run directly to check replies against."""
import queue

import openai

from core.checkpoints import load
from core.engine.engine import Engine
from core.engine.events import Done
from core.prompt.prompting import render_chat
from core.serving.run import RunningServer
from core.serving.state import ServerState
from tests.helpers import ROOT

KEY = "test-key-123"
DEMO = ROOT / "assets" / "models" / "llamadesk-demo"


class Served:
    """A running server, a client for it, the engine run directly, and finished jobs."""

    def __init__(self, path, **kw):
        self.finished: queue.Queue = queue.Queue()
        self.state = ServerState(load(path, device="cpu", dtype="float32"), api_key=KEY,
                                 on_done=self.finished.put, **kw)
        self.server = RunningServer(self.state)
        self.url = self.server.url
        self.client = openai.OpenAI(base_url=self.url, api_key=KEY, max_retries=0, timeout=60)
        self.direct = load(path, device="cpu", dtype="float32")
        self.engine = Engine(self.direct.model, self.direct.tokenizer, stop_ids=self.direct.stop_ids)

    @property
    def model(self) -> str:
        return self.state.model_id

    def alone(self, prompt_ids, params, strip=False) -> Done:
        return [e for e in self.engine.generate(prompt_ids, params, strip_leading_space=strip) if isinstance(e, Done)][0]


def chat_ids(s: Served, messages):
    return render_chat(s.direct.chat_format, messages)
