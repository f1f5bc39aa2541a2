"""Rendering a model's own Jinja chat template, bounded.

The template is code that came with a downloaded model. It is rendered in a child process
(:mod:`core.prompt.template_child`: jinja2's ImmutableSandboxedEnvironment, address space
capped at 1 GiB, output counted as it is written) that is started once and kept; a render
that takes longer than the time limit (counted from the request: the child's own start,
seconds on a busy machine, is not) kills it (the next render starts a fresh one). A
template that loops without end, writes megabytes, or reaches for attributes outside the
sandbox is refused with one line saying which, and the app goes on.
"""
from __future__ import annotations

import atexit
import json
import queue
import subprocess
import sys
import threading
from pathlib import Path

from core.errors import SettingsError

__all__ = ["TemplateRenderer", "render_template", "TIME_LIMIT_S", "MAX_CHARS"]

TIME_LIMIT_S = 3.0
START_LIMIT_S = 60.0  # starting Python and importing jinja2: seconds on a busy machine
MAX_CHARS = 4_000_000  # beyond any context a model here has
_CHILD = Path(__file__).with_name("template_child.py")


class TemplateRenderer:
    """One child process rendering templates, one render at a time."""

    def __init__(self, time_limit_s: float = TIME_LIMIT_S, max_chars: int = MAX_CHARS):
        self.time_limit_s = time_limit_s
        self.max_chars = max_chars
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._lines: queue.Queue = queue.Queue()

    def render(self, template: str, context: dict) -> str:
        """The template's text for ``context`` (JSON-shaped data); SettingsError when the
        template is refused."""
        line = json.dumps({"template": template, "context": context, "max_chars": self.max_chars},
                          ensure_ascii=True) + "\n"
        with self._lock:
            answer = self._ask(line)
        if "error" in answer:
            raise SettingsError(f"the model's chat template was refused: {answer['error']}")
        return answer["text"]

    def _ask(self, line: str) -> dict:
        proc = self._started()
        if proc is None:
            return {"error": f"its renderer did not start within {START_LIMIT_S:g} s"}
        try:
            proc.stdin.write(line)
            proc.stdin.flush()
            reply = self._lines.get(timeout=self.time_limit_s)
        except queue.Empty:
            self.close()
            return {"error": f"it took longer than {self.time_limit_s:g} s to render"}
        except OSError:
            reply = None
        if reply is None:  # the child died: out of memory beyond what Python could catch
            self.close()
            return {"error": "its renderer stopped (it needs more memory or time than a template may use)"}
        return json.loads(reply)

    def _started(self) -> subprocess.Popen | None:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._lines = queue.Queue()
        # -I: none of the user's or the project's modules on the child's path
        self._proc = subprocess.Popen([sys.executable, "-I", str(_CHILD)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                      encoding="utf-8", bufsize=1)
        threading.Thread(target=_pump, args=(self._proc.stdout, self._lines), daemon=True,
                         name="template-renderer").start()
        try:
            ready = self._lines.get(timeout=START_LIMIT_S)
        except queue.Empty:
            ready = None
        if not ready:
            self.close()
            return None
        return self._proc

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc is not None:
            proc.stdin.close()


def _pump(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)
    stream.close()


_SHARED = TemplateRenderer()
atexit.register(_SHARED.close)


def render_template(template: str, context: dict) -> str:
    """Render with the process's shared renderer (see :class:`TemplateRenderer`)."""
    return _SHARED.render(template, context)
