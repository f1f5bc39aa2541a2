"""ToolBox: one set of names over several providers (clashes renamed and said), calls routed,
bounded and recorded with the provider that ran them; a failing provider never raises."""
from __future__ import annotations

import threading

from core.tools.box import ToolBox
from core.tools.builtin import BuiltinTools
from core.tools.spec import Tool, ToolCall, ToolResult


class Fake:
    """A provider as the protocol describes it, misbehaving on request."""
    default_timeout = 7.0

    def __init__(self, name, tools, *, raises=False, fails_listing=False, big=0):
        self.name, self.source = name, f"mcp:{name}"
        self._tools = [Tool(t, f"{t} of {name}", source=self.source) for t in tools]
        self.raises, self.fails_listing, self.big = raises, fails_listing, big
        self.calls = []

    def tools(self):
        if self.fails_listing:
            raise RuntimeError("server exploded")
        return self._tools

    def call(self, call, *, cancel, timeout):
        self.calls.append((call.name, call.arguments, timeout))
        if self.raises:
            raise ValueError("provider bug")
        return ToolResult(call.id, call.name, "r" * self.big if self.big else f"{self.name}:{call.name}")


def test_calls_are_routed_and_recorded_with_their_provider():
    a, b = Fake("files", ["read", "list"]), Fake("web", ["search"])
    box = ToolBox([a, b, BuiltinTools(["calculator"])])
    assert [t.name for t in box.tools()] == ["read", "list", "search", "calculator"]
    result = box.call(ToolCall("search", {"q": "x"}, id="call_1"))
    assert (result.content, result.call_id, result.name) == ("web:search", "call_1", "search")
    assert b.calls == [("search", {"q": "x"}, 7.0)]  # the provider's own default timeout
    assert box.call(ToolCall("calculator", {"expression": "2+2"})).content == "4"
    assert [(r.provider, r.tool) for r in box.runs] == [("mcp:web", "search"), ("builtin", "calculator")]
    assert box.provider_of("read") == "mcp:files" and box.provider_of("nope") is None


def test_a_name_clash_is_renamed_per_provider_and_said():
    a, b = Fake("files", ["search", "read"]), Fake("web", ["search"])
    box = ToolBox([a, b])
    assert [t.name for t in box.tools()] == ["files_search", "read", "web_search"]
    assert box.notes == ["the tool 'search' is offered by mcp:files, mcp:web: they are named files_search, web_search"]
    assert box.call(ToolCall("web_search")).content == "web:search"
    assert b.calls[0][0] == "search"  # the provider hears its own name
    assert box.runs[0].tool == "search" and box.runs[0].call.name == "web_search"


def test_unknown_tools_failing_providers_cancel_and_big_results_are_results():
    bad, big = Fake("bad", ["boom"], raises=True), Fake("big", ["huge"], big=100_000)
    box = ToolBox([bad, big, Fake("down", ["x"], fails_listing=True)], max_result_chars=1000)
    assert [t.name for t in box.tools()] == ["boom", "huge"]
    assert box.notes == ["mcp:down: cannot list its tools: server exploded"]
    unknown = box.call(ToolCall("invented"))
    assert unknown.is_error and "no tool named 'invented'" in unknown.content and "boom, huge" in unknown.content
    boom = box.call(ToolCall("boom"))
    assert boom.is_error and "provider bug" in boom.content
    huge = box.call(ToolCall("huge"))
    assert huge.truncated and len(huge.content) < 1100 and "cut: the result was 100,000 characters" in huge.content
    stop = threading.Event()
    stop.set()
    assert "cancelled" in box.call(ToolCall("huge"), cancel=stop).content and len(big.calls) == 1
    assert len(box.runs) == 4


def test_refresh_lists_again():
    p = Fake("s", ["one"])
    box = ToolBox([p])
    assert [t.name for t in box.tools()] == ["one"]
    p._tools.append(Tool("two", source=p.source))
    assert [t.name for t in box.tools()] == ["one"]
    assert [t.name for t in box.refresh()] == ["one", "two"]


def test_providers_are_listed_at_once_not_one_after_another():
    meet = threading.Barrier(3, timeout=10)  # each listing waits for the other two: only concurrent ones pass

    class Slow(Fake):
        def tools(self):
            meet.wait()
            return super().tools()
    box = ToolBox([Slow("a", ["x"]), Slow("b", ["y"]), Slow("c", ["z"])])
    assert [t.name for t in box.tools()] == ["x", "y", "z"]
