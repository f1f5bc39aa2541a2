"""A lane's own settings in the comparison window: speculative decoding (prompt lookup or a
draft model, never both), output formats, the logit bias field, and what a server lane
refuses; each run on the real worker, saved, exported and reopened."""
from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QWidget

from core.engine.lanes import lane_stats
from core.engine.settings import SCHEMA, SamplingParams
from gui.widgets.stats import format_stats
from gui.compare.lane_column import FIELDS, SEED_RANDOM, LaneColumn
from gui.compare.models import LaneModel
from gui.compare.view import CompareView
from gui.settings import speculative

from tests.gui.compare.common import (PROMPT, ROOT, FakeBridge, bridge, history, load_and_run, snapshot,  # noqa: F401  (fixtures)
                                      story, token_text_of)
from tests.gui.ui_helpers import loop, wheel  # noqa: F401  (fixtures)


def test_a_lane_sets_prompt_lookup_or_a_draft_model_never_both(qtbot, loop, history, monkeypatch, tmp_path):
    """The lane editor's speculative row (the sampling panel's controls): off, prompt lookup
    with its n, or a draft model's path with a "…" chooser. One mode at a time, so what a
    lane sends always validates; the summary names the draft model; a lane on a server that
    drafts is refused inline; the stats line names the draft model that drafted."""
    v = CompareView(bridge=FakeBridge(), history=history, prompt=PROMPT,
                    lanes=[{"temperature": 0.0, "lookup": 3}, {"temperature": 0.0},
                           {"temperature": 0.0, "draft": "/models/small.gguf"}])
    qtbot.addWidget(v)
    v.resize(1000, 700)
    v.show()
    look, plain, drafted = v.columns
    field = look.findChild(QWidget, "lane_lookup")
    assert field is not None and field.value() == 3 and "lookup" in field.toolTip().lower() and field.isVisible()
    assert look.speculative.mode() == "lookup" and not look.speculative.draft_row.isVisible()
    assert plain.speculative.mode() == "off" and plain.speculative.combo.currentText() == "Off"
    assert not plain.findChild(QWidget, "lane_lookup").isVisible() and not plain.speculative.draft_row.isVisible()
    assert drafted.findChild(QWidget, "lane_draft").text() == "/models/small.gguf"
    assert drafted.speculative.draft_row.isVisible() and drafted.findChild(QWidget, "lane_draft_browse").isVisible()
    assert [(s["lookup"], s["draft"]) for s in v.lane_settings()] == [(3, ""), (0, ""), (0, "/models/small.gguf")]
    assert drafted.divergence.text() == "lookup off · draft small.gguf"  # the summary against the baseline

    # "…" chooses a draft model: the lane switches from lookup to that draft, never both.
    chosen = tmp_path / "tiny draft.gguf"
    chosen.write_bytes(b"GGUF")
    asked = []
    monkeypatch.setattr(speculative, "choose_model_path", lambda parent, title, start="": asked.append(title)
                        or str(chosen))
    look.speculative.combo.setCurrentIndex(look.speculative.combo.findData("draft"))
    assert look.settings()["lookup"] == 0 and look.settings()["draft"] == ""  # a draft with no path yet: off
    qtbot.mouseClick(look.findChild(QWidget, "lane_draft_browse"), Qt.LeftButton)
    assert asked == ["Choose a draft model"]
    assert (look.settings()["lookup"], look.settings()["draft"]) == (0, str(chosen))
    assert plain.divergence.text() == "draft off"  # lane 1 is the baseline: the others say how they differ
    # Back to lookup: its n was kept, the draft is off (and its path kept for later).
    look.speculative.combo.setCurrentIndex(look.speculative.combo.findData("lookup"))
    assert (look.settings()["lookup"], look.settings()["draft"]) == (3, "")
    # Typing a path (then leaving the field) is an edit the summary follows; a path that
    # names nothing is said inline at once, and goes when the path is right.
    drafted.speculative.draft.setText("/models/other.gguf")
    drafted.speculative.draft.editingFinished.emit()
    assert drafted.divergence.text() == "lookup off · draft other.gguf"
    assert drafted.notice.isVisible() and drafted.notice.text() == "Draft model not found: /models/other.gguf"
    drafted.speculative.draft.setText(str(chosen))
    drafted.speculative.draft.editingFinished.emit()
    assert drafted.notice.isHidden()
    for s in v.lane_settings():
        SamplingParams.from_dict(s).validate()

    # A lane on a server decodes there: lookup or a draft is refused inline, nothing runs.
    v.set_lane_model(2, LaneModel("server", "remote-model", tokenizer=None, path="http://127.0.0.1:9/v1"))
    assert v.run() is None and not v.running
    assert "lane 3 drafts (speculative) on a server" in v.status.text()
    assert not drafted.notice.isHidden() and "speculative decoding to Off" in drafted.notice.text()



def test_a_lane_given_settings_that_name_lookup_and_a_draft_keeps_the_draft(qtbot):
    """Settings that name both (a hand-edited save): the draft wins, the lane stays valid."""
    plain = LaneColumn(settings={"temperature": 0.0})
    qtbot.addWidget(plain)
    plain.set_settings({"lookup": 4, "draft": "/models/x.gguf"})
    assert (plain.settings()["lookup"], plain.settings()["draft"]) == (0, "/models/x.gguf")
    plain.set_settings({"lookup": 2})  # lookup alone replaces the draft
    assert (plain.settings()["lookup"], plain.settings()["draft"]) == (2, "")
    plain.set_settings({"lookup": "many", "draft": 7})  # not a number, not a path: off
    assert (plain.settings()["lookup"], plain.settings()["draft"]) == (0, "")
    SamplingParams.from_dict(plain.settings()).validate()


def test_the_stats_line_names_what_drafted():
    st = lane_stats([5, 6, 7], [-0.1, -0.2, -0.3], {"decode_tok_s": 10.0, "speculative": {
        "kind": "lookup", "lookup": 3, "draft": "", "drafted": 10, "accepted": 7, "acceptance": 0.7,
        "mean_draft": 2.5, "speedup": 1.6}})
    text = format_stats({"stats": st, "stop_reason": "length"})
    assert "speculative (lookup 3): 70% of 10 drafted accepted, 2.5 a step · ≈1.60× plain" in text
    st["speculative"] = {**st["speculative"], "kind": "draft", "lookup": 0, "draft": "/models/small.gguf"}
    assert "speculative (draft small.gguf): 70% of 10 drafted accepted" in format_stats({"stats": st})


def test_draft_model_lanes_run_save_export_and_reopen_and_a_bad_draft_fails_only_its_lane(
        qtbot, loop, bridge, history, story, fixtures, random_draft, tmp_path):
    """Draft-model lanes through the real worker: a lane drafting with a random model of
    the same tokenizer gives the greedy lane's tokens (speculative decoding is exact) and
    says how drafting went; a lane whose draft file is missing and one whose draft model
    has another tokenizer each get an inline notice, and the other lanes still run. The
    draft model is saved, exported (JSON and Markdown) and reopened with the comparison."""
    demo = ROOT / "assets" / "models" / "llamadesk-demo"
    missing = tmp_path / "gone.gguf"
    lanes = [{"temperature": 0.0, "max_new_tokens": 24},
             {"temperature": 0.0, "max_new_tokens": 24, "draft": str(random_draft)},
             {"temperature": 0.0, "max_new_tokens": 24, "draft": str(missing)},
             {"temperature": 0.0, "max_new_tokens": 24, "draft": str(demo)},
             {"temperature": 0.0, "max_new_tokens": 24, "lookup": 2}]
    v = CompareView(bridge=bridge, history=history, prompt=PROMPT, mode="completion", lanes=lanes,
                    token_text=token_text_of(story.tokenizer))
    qtbot.addWidget(v)
    v.resize(1600, 800)
    v.show()

    load_and_run(loop, bridge, fixtures, v, 90)
    plain, drafted, gone, foreign, lookup = (c.run for c in v.columns)
    assert plain.stop_reason == "length" and len(plain.ids) == 24
    assert drafted.error is None and drafted.ids == plain.ids and lookup.ids == plain.ids
    sp = drafted.engine_stats["speculative"]
    # (a random draft's choices rarely agree with the target's, so it may never earn a draft:
    # drafted can be 0; the lane still ran as a drafting lane and says so)
    assert sp["kind"] == "draft" and sp["draft"] == str(random_draft) and sp["accepted"] <= sp["drafted"]
    assert "speculative (draft random-draft.gguf)" in v.columns[1].stats.text()
    assert gone.error and "draft model not found" in gone.error and not gone.ids
    assert "draft model not found" in v.columns[2].notice.text() and not v.columns[2].notice.isHidden()
    assert foreign.error and "another vocabulary" in foreign.error and not foreign.ids
    assert "another vocabulary" in v.columns[3].notice.text() and "draft model" in v.columns[3].notice.text()
    assert all(v.columns[i].notice.isHidden() for i in (0, 1, 4))
    assert "lane 3" in v.status.text() and "lane 4" in v.status.text()
    snapshot(v, "compare_draft_lanes")

    md = Path(v.export("md", str(tmp_path / "c.md"))).read_text()
    assert f"draft model {random_draft}" in md and "prompt lookup 2" in md
    js = json.loads(Path(v.export("json", str(tmp_path / "c.json"))).read_text())
    saved = js["conversation"]["meta"]["comparison"]["lanes"]
    assert [ln["settings"]["draft"] for ln in saved] == ["", str(random_draft), str(missing), str(demo), ""]
    assert [ln["settings"]["lookup"] for ln in saved] == [0, 0, 0, 0, 2]
    v2 = CompareView(bridge=bridge, history=history, token_text=token_text_of(story.tokenizer))
    qtbot.addWidget(v2)
    v2.open_comparison(v.saved_id)
    assert [(c.settings()["lookup"], c.settings()["draft"]) for c in v2.columns] == \
        [(0, ""), (0, str(random_draft)), (0, str(missing)), (0, str(demo)), (2, "")]
    assert v2.columns[1].speculative.mode() == "draft" and v2.columns[1].run.ids == plain.ids


def test_lanes_with_output_formats_validate_save_and_show_what_the_constraint_removed(
        qtbot, loop, bridge, history, story, fixtures, tmp_path):
    """Per-lane constraints through the real worker: a JSON-schema lane validates, a regex
    lane matches, a free lane beside them is untouched; saved, exported and reopened with
    their constraints; the inspector marks the model's favourites the schema removed; a
    schema that cannot compile is an inline notice in its lane."""


    schema = {"type": "object", "required": ["name", "age"], "additionalProperties": False,
              "properties": {"name": {"type": "string", "pattern": "^[A-Za-z]{1,8}$"},
                             "age": {"type": "integer", "minimum": 0, "maximum": 99}}}
    lanes = [{"temperature": 0.0, "max_new_tokens": 40, "constraint": {"kind": "json_schema", "text": json.dumps(schema)}},
             {"temperature": 1.0, "seed": 3, "max_new_tokens": 30, "constraint": {"kind": "regex", "text": "(Tom|Amy) is [0-9]{1,2}"}},
             {"temperature": 0.0, "max_new_tokens": 12}]
    v = CompareView(bridge=bridge, history=history, prompt=PROMPT, mode="completion", lanes=lanes,
                    token_text=token_text_of(story.tokenizer))
    qtbot.addWidget(v)
    v.resize(1400, 760)
    v.show()
    assert v.columns[0].constraint_kind.currentData() == "json_schema"
    assert not v.columns[1].constraint_text.isHidden() and v.columns[2].constraint_text.isHidden()

    load_and_run(loop, bridge, fixtures, v, 60)
    runs = [c.run for c in v.columns]
    assert [r.stop_reason for r in runs[:2]] == ["eos", "eos"], [r.stop_reason for r in runs]
    jsonschema.validate(json.loads(runs[0].text), schema)
    assert re.fullmatch("(Tom|Amy) is [0-9]{1,2}", runs[1].text)
    assert runs[2].text.startswith(", there was")  # the free lane: the fixture's greedy text
    v.inspect_token(0, 0)
    marked = [r for r in v.inspector.rows if r["constrained"]]
    assert marked and marked[0]["id"] == v.inspector.rows[0]["id"]  # the model's favourite was not "{"
    assert all(shown[2] == "constraint" for row, shown in zip(v.inspector.rows, v.inspector.shown_values())
               if row["constrained"])
    snapshot(v, "compare_constraints")
    md = Path(v.export("md", str(tmp_path / "c.md"))).read_text()
    assert "format JSON schema" in md and "format regular expression" in md
    js = json.loads(Path(v.export("json", str(tmp_path / "c.json"))).read_text())
    saved = js["conversation"]["meta"]["comparison"]["lanes"]
    assert saved[0]["settings"]["constraint"]["kind"] == "json_schema" and saved[2]["settings"]["constraint"] is None
    v.save()
    v2 = CompareView(bridge=bridge, history=history, token_text=token_text_of(story.tokenizer))
    qtbot.addWidget(v2)
    v2.open_comparison(v.saved_id)
    assert [c.settings()["constraint"] for c in v2.columns] == [ln.get("constraint") for ln in lanes]
    # A regex that cannot compile: the lane says so inline as it is typed.
    col = v2.columns[1]
    col.constraint_text.setText("(Tom|Amy")
    col.constraint_text.editingFinished.emit()
    assert not col.notice.isHidden() and "cannot be compiled" in col.notice.text()


def test_lane_logit_bias_field_runs_saves_and_reopens(qtbot, loop, bridge, history, story, fixtures, tmp_path):
    """A lane's logit bias field through the real worker: the lane with 'girl=-inf' never
    uses girl's tokens while the greedy lane beside it does; a malformed item is left out
    and named inline; the bias is saved, exported (JSON and Markdown) and reopened."""
    girl = set(story.tokenizer.encode("girl"))
    v = CompareView(bridge=bridge, history=history, prompt=PROMPT, mode="completion",
                    lanes=[{"temperature": 0.0, "max_new_tokens": 16}] * 2, token_text=token_text_of(story.tokenizer))
    qtbot.addWidget(v)
    col = v.columns[1]
    col.bias_edit.setText("girl=-inf, dragon=lots")
    col.bias_edit.editingFinished.emit()
    assert not col.bias_notice.isHidden() and "Left out" in col.bias_notice.text() \
        and "not a number" in col.bias_notice.text()
    assert col.settings()["logit_bias_text"] == ["girl=-inf"]
    assert v.columns[0].settings()["logit_bias_text"] == []
    assert "bias girl=-inf" in col.divergence.text()  # the summary against the baseline names it

    load_and_run(loop, bridge, fixtures, v, 60)
    plain, banned = (c.run for c in v.columns)
    assert girl <= set(plain.ids) and not girl & set(banned.ids)
    assert banned.params["logit_bias_text"] == ["girl=-inf"]
    js = json.loads(Path(v.export("json", str(tmp_path / "c.json"))).read_text())
    saved = js["conversation"]["meta"]["comparison"]["lanes"]
    assert [ln["settings"]["logit_bias_text"] for ln in saved] == [[], ["girl=-inf"]]
    assert "logit bias girl=-inf" in Path(v.export("md", str(tmp_path / "c.md"))).read_text()
    v2 = CompareView(bridge=bridge, history=history, token_text=token_text_of(story.tokenizer))
    qtbot.addWidget(v2)
    v2.open_comparison(v.saved_id)
    assert v2.columns[1].bias_edit.text() == "girl=-inf" and v2.columns[1].bias_notice.isHidden()
    assert v2.columns[0].bias_edit.text() == ""


def test_lane_logit_bias_on_a_server_is_refused_inline(qtbot, loop, history):
    v = CompareView(bridge=FakeBridge(), history=history, prompt=PROMPT,
                    lanes=[{"temperature": 0.0}, {"temperature": 0.0, "logit_bias_text": ["girl=-inf"]}])
    qtbot.addWidget(v)
    v.set_lane_model(1, LaneModel("server", "remote-model", tokenizer=None, path="http://127.0.0.1:9/v1"))
    assert v.run() is None and not v.running
    assert "lane 2 sets a logit bias on a server" in v.status.text()
    assert not v.columns[1].notice.isHidden() and "server" in v.columns[1].notice.text()


def test_a_lanes_fields_take_the_settings_schemas_ranges_and_steps(qtbot):
    """Each numeric field of a lane is built from its setting's declaration: the control's
    range (the seed's "random" below it), step, decimals and help."""
    col = LaneColumn(settings={})
    qtbot.addWidget(col)
    assert tuple(col.fields) == FIELDS
    for key, w in col.fields.items():
        setting = SCHEMA[key]
        lo, hi = setting.widget_range()
        assert (w.minimum(), w.maximum()) == ((SEED_RANDOM if key == "seed" else lo), hi), key
        assert w.singleStep() == setting.step and w.toolTip() == setting.help, key
        assert setting.accepts(w.maximum()) and (key == "seed" or setting.accepts(w.minimum())), key
        if setting.kind is float:
            assert w.decimals() == setting.decimals, key
    col.fields["seed"].setValue(SEED_RANDOM)
    assert col.settings()["seed"] is None  # "random"


def test_the_wheel_over_lane_settings_and_the_bar_scrolls_instead_of_editing(qtbot, loop, history, monkeypatch):
    """Issue 22 #14 in the comparison window: a wheel over a lane's spin or combo box, the
    baseline or the sweep setting goes to the lanes area, not to the control."""
    asked = []  # before the fix a wheel over the lane's model combo opened "Other checkpoint…"
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (asked.append(a), ("", ""))[1]))
    v = CompareView(bridge=FakeBridge(), history=history, prompt=PROMPT,
                    lanes=[{"temperature": 0.5}, {"temperature": 0.9}])
    qtbot.addWidget(v)
    v.resize(900, 600)
    v.show()
    v.bar.sweep_button.click()
    lane = v.columns[1]
    controls = [lane.fields["temperature"], lane.fields["seed"], lane.speculative.combo, lane.model_combo,
                v.bar.baseline_combo, v.sweep_row.param, v.prompt_row.mode_combo]
    shown = [c.text() if hasattr(c, "text") else c.currentText() for c in controls]
    taken = [wheel(c, -1) for c in controls]
    assert [c.text() if hasattr(c, "text") else c.currentText() for c in controls] == shown
    assert not any(t in controls for t in taken)
    assert wheel(lane.fields["temperature"]) is v.scroll or wheel(lane.fields["temperature"]) is None
    assert v.lane_settings()[1]["temperature"] == 0.9 and asked == []
