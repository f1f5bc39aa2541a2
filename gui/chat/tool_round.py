"""A reply's tool calls, from the approval card to the reply that carries on after them.

When a reply ends with tool calls (stop reason ``tool_calls``), :class:`ToolRound` takes
them one at a time, in the order the model wrote them: a call the user has not allowed
("always allow this tool in this chat", unless the global "ask every time" is on) waits
for Run / Edit arguments / Deny on its card; a call that runs, runs OFF the UI thread
(``asyncio.to_thread`` on the qasync loop) with a timeout and a cancel event that Stop
sets. Every call gets a result, stored as its own ``tool`` message (a failure, a denial,
a stop or a missing tool is a result too, saying so), so the conversation stays one the
model and any OpenAI server can read. When the last result is in, the reply continues
(``continueWith``) unless the user stopped, or the loop guard found :attr:`max_rounds`
rounds of calls since the user last spoke, which it says.

No widget here: the chat column shows the cards and results from the signals.
"""
from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field, replace

from PySide6.QtCore import QObject, Signal

from core.history.records import HistoryError, Message
from core.history.tool_messages import TOOL_ROLE, calls_of, result_record
from core.tools.spec import MAX_RESULT_CHARS, Tool, ToolCall, ToolResult

from gui.chat.conversation import ConversationModel

DEFAULT_MAX_ROUNDS = 8
DEFAULT_TIMEOUT = 60.0
GRACE_S = 5.0  # a provider that ignores its own timeout is given up on this much later


@dataclass
class _Round:
    """The calls of one reply and how far they got."""
    conv_id: int
    reply_id: int
    calls: list[ToolCall]
    tools: dict[str, Tool]  # by name: the tools the chat offered when the round began
    last_id: int  # the message the next result goes under
    index: int = 0
    asking: bool = False
    card: dict = field(default_factory=dict)  # what the waiting call's card shows
    task: asyncio.Task | None = field(default=None, repr=False)
    cancel: threading.Event | None = field(default=None, repr=False)
    stopped: str = ""  # why the round stopped early ("" while it runs)


class ToolRound(QObject):
    """Runs the tool calls of the reply on screen.

    Args:
        conversation: the conversation on screen (results are stored in it).
        tools: ``tools() -> list[Tool]``: what the open chat offers now (each with its
            ``source``), and ``provider(source)``: the :class:`~core.tools.spec.ToolProvider`
            that runs a source's tools (None when it is gone).
        prefs: ``always(conv_id) -> set[str]`` and ``allow_always(conv_id, name)``: the
            tools the user allowed without asking in a chat.
        check: ``check(tool, arguments) -> str``: why arguments do not fit a tool's schema
            ("" when they do); a call that does not fit is answered with that, not run.

    Signals:
        approvalNeeded(dict): a call waits for the user: {"call_id", "name", "source",
            "description", "arguments" (dict), "raw", "reply_id"}.
        callRunning(str): the call with this id started running (its card says so).
        callSettled(str): the call's card can go (its result follows as a message).
        resultAdded(dict): a tool message was stored on the branch on screen (its view).
        notice(str): a round stopped early or could not go on, in the user's words.
        busyChanged(bool): a round started or ended.
        continueWith(int): every call has its result: answer this tool message.
    """

    approvalNeeded = Signal(dict)
    callRunning = Signal(str)
    callSettled = Signal(str)
    resultAdded = Signal(dict)
    notice = Signal(str)
    busyChanged = Signal(bool)
    continueWith = Signal(int)

    def __init__(self, *, conversation: ConversationModel, tools, prefs, check=None, parent=None):
        super().__init__(parent)
        self.conversation = conversation
        self.tools = tools
        self.prefs = prefs
        self.check = check
        self.ask_every_time = False  # True: even tools always allowed in a chat ask first
        self.max_rounds = DEFAULT_MAX_ROUNDS
        self.timeout = DEFAULT_TIMEOUT
        self.round: _Round | None = None
        self.problem = ""  # why the last decide() could not run the call

    @property
    def busy(self) -> bool:
        return self.round is not None

    @property
    def running(self) -> bool:
        r = self.round
        return r is not None and r.task is not None and not r.task.done()

    def pending(self) -> dict | None:
        """The card of the call waiting for the user (None when none waits)."""
        r = self.round
        return r.card if r is not None and r.asking else None

    # ------------------------------------------------------------------ starting

    def on_reply(self, view: dict) -> None:
        """A reply finished: when it ended with tool calls, their round begins."""
        if view.get("id") is not None and view.get("stop_reason") == "tool_calls" and view.get("tool_calls"):
            self.start(int(view["id"]))

    def start(self, reply_id: int) -> bool:
        """Begin the round of reply ``reply_id``'s calls; False when it has none or one runs."""
        if self.round is not None or self.conversation.conv_id is None:
            return False
        try:
            reply = self.conversation.message(reply_id)
        except HistoryError:
            return False
        calls = calls_of(reply)
        if not calls:
            return False
        offered = {t.name: t for t in self.tools.tools()}
        self.round = _Round(self.conversation.conv_id, reply.id, calls, offered, reply.id)
        self.busyChanged.emit(True)
        rounds = self._rounds_since_user(reply)
        if rounds > self.max_rounds:
            self._stop(f"Stopped after {self.max_rounds} rounds of tool calls in a row (the loop guard): "
                       "the model kept calling tools. Send a message to carry on.")
            return True
        self._next()
        return True

    def _rounds_since_user(self, reply: Message) -> int:
        """Replies with tool calls on the branch since the user's last message, this one included."""
        n = 0
        for m in reversed(self.conversation.history.path_to(reply.id)):
            if m.role == "user":
                break
            n += m.role == "assistant" and bool(m.tool_calls)
        return n

    # ------------------------------------------------------------------ one call at a time

    def _next(self) -> None:
        r = self.round
        if r is None:
            return
        if r.index >= len(r.calls):
            self._end(r)
            return
        call = r.calls[r.index]
        tool = r.tools.get(call.name)
        problem = self._problem(call, tool)
        if problem:
            self._answer(r, ToolResult.bounded(call, problem, is_error=True), tool.source if tool else "")
            return
        if self._allowed(r, call.name):
            self._run(r, call, tool)
            return
        r.asking = True
        r.card = {"call_id": call.id, "name": call.name, "source": tool.source, "description": tool.description,
                  "arguments": call.arguments, "raw": call.raw, "reply_id": r.reply_id}
        self.approvalNeeded.emit(r.card)

    def _problem(self, call: ToolCall, tool: Tool | None) -> str:
        """Why ``call`` cannot run ("" when it can): what the model is told instead."""
        if call.error:
            return f"Error: the call to {call.name} could not be used: {call.error}"
        if tool is None:
            return (f"Error: there is no tool named {call.name} in this chat (it was not offered, "
                    "or its server was removed or turned off).")
        if self.tools.provider(tool.source) is None:
            return f"Error: {call.name} is no longer available ({tool.source} was removed or turned off)."
        why = self.check(tool, call.arguments) if self.check is not None else ""
        return f"Error: the arguments do not fit {call.name}'s parameters: {why}" if why else ""

    def _allowed(self, r: _Round, name: str) -> bool:
        return not self.ask_every_time and name in self.prefs.always(r.conv_id)

    def decide(self, call_id: str, action: str, *, arguments: dict | None = None, always: bool = False) -> bool:
        """The user's answer on a card: "run" (with edited ``arguments``, if given;
        ``always``: this tool runs without asking in this chat from now on) or "deny".
        False when that card is not the one waiting."""
        r = self.round
        if r is None or not r.asking or r.index >= len(r.calls) or r.calls[r.index].id != call_id:
            return False
        call = r.calls[r.index]
        r.asking = False
        if action == "deny":
            self._answer(r, ToolResult.bounded(call, "The user declined to run this call.", is_error=True),
                         r.tools[call.name].source)
            return True
        if always:
            self.prefs.allow_always(r.conv_id, call.name)
        if arguments is not None and arguments != call.arguments:
            call = replace(call, arguments=dict(arguments), raw="")
            r.calls[r.index] = call
            why = self.check(r.tools[call.name], call.arguments) if self.check is not None else ""
            if why:  # edited into arguments the tool cannot take: said on its card, asked again
                r.asking = True
                self.problem = f"Those arguments do not fit {call.name}: {why}"
                return False
        self._run(r, call, r.tools[call.name])
        return True

    def _run(self, r: _Round, call: ToolCall, tool: Tool) -> None:
        r.cancel = threading.Event()
        r.task = asyncio.ensure_future(self._call(r, call, tool, r.cancel))
        self.callRunning.emit(call.id)

    async def _call(self, r: _Round, call: ToolCall, tool: Tool, cancel: threading.Event) -> None:
        provider = self.tools.provider(tool.source)
        try:
            if provider is None:  # removed while its card waited
                raise LookupError(f"{tool.source} was removed or turned off")
            result = await asyncio.wait_for(
                asyncio.to_thread(provider.call, call, cancel=cancel, timeout=self.timeout), self.timeout + GRACE_S)
        except asyncio.CancelledError:
            cancel.set()
            result = ToolResult.bounded(call, "Error: the user stopped this call before it finished.", is_error=True)
        except asyncio.TimeoutError:
            cancel.set()
            result = ToolResult.bounded(call, f"Error: {call.name} did not answer within {self.timeout:g} s.",
                                        is_error=True)
        except Exception as e:  # noqa: BLE001 — a provider that raises still answers the model
            result = ToolResult.bounded(call, f"Error: {call.name} failed: {e}", is_error=True)
        if not isinstance(result, ToolResult):
            result = ToolResult.bounded(call, f"Error: {call.name} gave no result.", is_error=True)
        elif len(result.content) > MAX_RESULT_CHARS + 200:  # a provider that did not cut its own
            result = replace(ToolResult.bounded(call, result.content, is_error=result.is_error), name=call.name)
        if r is self.round:
            self._answer(r, result, tool.source)

    # ------------------------------------------------------------------ results

    def _answer(self, r: _Round, result: ToolResult, source: str) -> None:
        """Store ``result`` as the next tool message and go on to the next call."""
        r.task = None
        call = r.calls[r.index]
        self.callSettled.emit(call.id)
        try:
            m = self.conversation.history.add_message(
                r.conv_id, role=TOOL_ROLE, text=result.content, parent_id=r.last_id,
                tool_result=result_record(replace(result, call_id=call.id, name=call.name), source))
        except HistoryError as e:
            self._finish(r, f"The tool result could not be saved, so the reply does not go on: {e}")
            return
        r.last_id, r.index = m.id, r.index + 1
        if r.conv_id == self.conversation.conv_id:
            self.resultAdded.emit(self.conversation.view_message(m))
            self.conversation.listChanged.emit()
        if r.stopped:
            self._stop(r.stopped)
        else:
            self._next()

    def _end(self, r: _Round) -> None:
        # The reply goes on before the round says it ended: busy never drops in between.
        self.round = None
        if not r.stopped and r.conv_id == self.conversation.conv_id:
            self.continueWith.emit(r.last_id)
        self.busyChanged.emit(False)

    def _finish(self, r: _Round, why: str) -> None:
        if self.round is r:
            self.round = None
            self.busyChanged.emit(False)
        if why:
            self.notice.emit(why)

    def stop(self, why: str = "Tool calls stopped; what ran is kept. Send a message to carry on.") -> None:
        """Stop the round: a running call is cancelled, the calls not run yet are answered
        as not run (so every call has its result), and the reply does not go on."""
        r = self.round
        if r is None:
            return
        if r.task is not None and not r.task.done():
            r.stopped = why
            r.cancel.set()
            r.task.cancel()  # _call answers it as stopped, then _stop answers the rest
            return
        self._stop(why)

    def _stop(self, why: str) -> None:
        r = self.round
        if r is None:
            return
        r.stopped = why
        r.asking = False
        while r.index < len(r.calls):
            call = r.calls[r.index]
            self.callSettled.emit(call.id)
            tool = r.tools.get(call.name)
            result = ToolResult.bounded(call, "Not run: the tool calls were stopped.", is_error=True)
            try:
                r.last_id = self.conversation.history.add_message(
                    r.conv_id, role=TOOL_ROLE, text=result.content, parent_id=r.last_id,
                    tool_result=result_record(result, tool.source if tool else "")).id
            except HistoryError as e:
                why = f"{why} (the rest could not be saved: {e})"
                break
            r.index += 1
        if r.conv_id == self.conversation.conv_id:
            self.conversation.pathChanged.emit()
        self._finish(r, why)
