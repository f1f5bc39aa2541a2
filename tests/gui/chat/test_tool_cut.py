"""A reply that ran out of tokens in the middle of a tool call: its footer says no tool was
called (the demo model, its context widened to hold the tool prompt)."""
import json
from dataclasses import replace

from gui.chat.reply import CUT_CALL
from tests.gui.ui_helpers import bridge, data_dir, load, loop, run, send, settings, window  # noqa: F401
from tests.helpers import ROOT


def test_a_call_cut_by_max_tokens_says_no_tool_ran(qtbot, loop, window, tmp_path):
    demo = ROOT / "assets" / "models" / "llamadesk-demo"
    wide = tmp_path / "wide"
    wide.mkdir()
    for f in demo.iterdir():
        if f.name != "params.json":
            (wide / f.name).symlink_to(f)
    (wide / "params.json").write_text(json.dumps({**json.loads((demo / "params.json").read_text()), "max_seq_len": 2048}))
    run(loop, load(window, wide))
    window.chats.tools.set_enabled("builtin:calculator", True)
    params = window.panel.params
    window.panel.params = lambda: replace(params(), tool_choice="required")
    reply = run(loop, send(qtbot, window, "What is 2^10?", max_tokens=4))
    assert reply["stop_reason"] == "length" and reply["tool_calls"] == [] and reply["text"].startswith(('{', '['))
    assert reply["incomplete"] == CUT_CALL
    assert CUT_CALL in window.chat.widget_for(reply["id"]).footer.text()
