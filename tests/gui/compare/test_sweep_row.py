"""The Sweep row: one lane per value of a setting, every setting it offers driven as a user
would, the lanes run on the real worker, saved and exported with each lane's value."""
from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtCore import Qt

from gui.compare.view import CompareView
from gui.settings import speculative

from tests.gui.compare.common import PROMPT, bridge, history, load_and_run, snapshot, story  # noqa: F401  (fixtures)
from tests.gui.ui_helpers import loop, run, until  # noqa: F401  (fixtures)


def test_sweep_every_knob_makes_those_lanes(qtbot, loop, bridge, history, story, fixtures):
    """The Sweep row over seed, prompt lookup, a logit bias and the output format on/off:
    the lanes it makes carry those settings (the rest copied from lane 1); a bias sweep runs
    through the real worker with each lane biased as swept; bad values are named inline."""
    girl = set(story.tokenizer.encode("girl"))
    v = CompareView(bridge=bridge, history=history, prompt=PROMPT, mode="completion",
                    lanes=[{"temperature": 0.0, "max_new_tokens": 16, "logit_bias_text": ["Lily=1"],
                            "constraint": {"kind": "regex", "text": "[a-z ,]+"}}])
    qtbot.addWidget(v)
    keys = [v.sweep_row.param.itemData(i) for i in range(v.sweep_row.param.count())]
    assert {"seed", "lookup", "logit_bias_text", "constraint"} <= set(keys)
    v.sweep_row.param.setCurrentIndex(keys.index("logit_bias_text"))
    assert "girl=-inf" in v.sweep_row.values.placeholderText()
    assert v.apply_sweep("lookup", "0, 3")
    assert [c.settings()["lookup"] for c in v.columns] == [0, 3]
    assert v.apply_sweep("seed", "4:6")
    assert [c.settings()["seed"] for c in v.columns] == [4, 5, 6]
    assert v.apply_sweep("constraint", "on, off")
    assert [c.settings()["constraint"] for c in v.columns] == [{"kind": "regex", "text": "[a-z ,]+"}, None]
    assert "output format: on, off" in v.status.text()
    assert not v.apply_sweep("logit_bias_text", "girl=lots") and "not a number" in v.sweep_row.error.text()
    assert v.lane_count() == 2  # a bad sweep changes nothing
    v.columns[0].set_settings({"constraint": None})
    assert not v.apply_sweep("constraint", "on, off") and "no output format" in v.sweep_row.error.text()
    assert v.apply_sweep("logit_bias_text", "girl=-inf, 0")
    assert [c.settings()["logit_bias_text"] for c in v.columns] == [["Lily=1", "girl=-inf"], ["Lily=1", "girl=0"]]
    assert [c.bias_edit.text() for c in v.columns] == ["Lily=1, girl=-inf", "Lily=1, girl=0"]

    load_and_run(loop, bridge, fixtures, v, 60)
    banned, kept = (c.run for c in v.columns)
    assert not girl & set(banned.ids) and girl <= set(kept.ids)


SWEEPS = [  # setting, values typed in the Sweep row, the lane values they make, how Markdown shows one
    ("temperature", "0, 0.7", [0.0, 0.7], "temperature {}"),
    ("top_p", "0.5, 0.9", [0.5, 0.9], "top_p {}"),
    ("top_k", "1, 40", [1, 40], "top_k {}"),
    ("min_p", "0, 0.1", [0.0, 0.1], "min_p {}"),
    ("repetition_penalty", "1, 1.3", [1.0, 1.3], "repetition_penalty {}"),
    ("seed", "4, 5", [4, 5], "seed {}"),
    ("max_new_tokens", "3, 5", [3, 5], "max_new_tokens {}"),
    ("num_beams", "1, 2", [1, 2], "num_beams {}"),
    ("length_penalty", "0, 2", [0.0, 2.0], None),  # said only where beams run (not in these lanes)
    ("lookup", "0, 2", [0, 2], "prompt lookup {}"),
    ("draft", None, ["", "DRAFT"], "draft model {}"),  # the "…" button fills it in
    ("constraint", "on, off", [{"kind": "regex", "text": "[a-z ,.]+"}, None], None),
    ("logit_bias_text", "girl=-inf, 0", [["girl=-inf"], ["girl=0"]], "logit bias {}"),
]


def test_every_knob_sweeps_from_the_sweep_row_and_its_lanes_run_save_and_export(
        qtbot, loop, bridge, history, story, fixtures, random_draft, monkeypatch, tmp_path):
    """Each setting the Sweep row offers, driven as a user would (choose it, type the values
    or pick a draft model with "…", Make lanes): the lanes carry the values, the worker runs
    them with exactly those settings (its Done echoes them), and the saved comparison's JSON
    and Markdown export name each lane's value."""
    monkeypatch.setattr(speculative, "choose_model_path", lambda *a, **k: str(random_draft))
    base = {"temperature": 0.8, "seed": 1, "max_new_tokens": 6}
    v = CompareView(bridge=bridge, history=history, prompt=PROMPT, mode="completion", lanes=[base])
    qtbot.addWidget(v)
    v.resize(1300, 760)
    v.show()
    qtbot.mouseClick(v.bar.sweep_button, Qt.LeftButton)
    keys = [v.sweep_row.param.itemData(i) for i in range(v.sweep_row.param.count())]
    assert sorted(keys) == sorted(k for k, *_ in SWEEPS)  # every knob, and nothing is left out here
    run(loop, bridge.load(str(fixtures / "stories260K.gguf"), device="cpu", dtype="float32"), 60)

    for key, typed, values, md_form in SWEEPS:
        values = [str(random_draft) if x == "DRAFT" else x for x in values]
        v.set_lanes([{**base, **({"constraint": values[0]} if key == "constraint" else {})}])
        v.sweep_row.param.setCurrentIndex(keys.index(key))
        assert v.sweep_row.browse_button.isVisible() == (key == "draft")
        v.sweep_row.values.clear()
        if typed is None:
            qtbot.mouseClick(v.sweep_row.browse_button, Qt.LeftButton)
            assert v.sweep_row.values.text() == f"off, {random_draft}"
        else:
            qtbot.keyClicks(v.sweep_row.values, typed)
        qtbot.mouseClick(v.sweep_row.apply_button, Qt.LeftButton)
        assert v.sweep_row.error.text() == "", (key, v.sweep_row.error.text())
        assert [c.settings()[key] for c in v.columns] == values, key
        if key == "draft":
            snapshot(v, "compare_draft_sweep")

        async def go():
            v.run()
            await until(lambda: not v.running, 60, f"the {key} sweep to run")
        run(loop, go(), 90)
        runs = [c.run for c in v.columns]
        assert all(r.finished and r.error is None for r in runs), (key, [r.error for r in runs])
        assert [r.params[key] for r in runs] == values, key  # what the worker ran
        js = json.loads(Path(v.export("json", str(tmp_path / f"{key}.json"))).read_text())
        saved = js["conversation"]["meta"]["comparison"]["lanes"]
        assert [ln["settings"][key] for ln in saved] == values, key
        md = Path(v.export("md", str(tmp_path / f"{key}.md"))).read_text()
        sections = md.split("## Lane ")[1:]
        for section, value in zip(sections, values):
            if key == "constraint":
                assert ("format regular expression" in section) == (value is not None)
            elif md_form is not None and (value or key not in ("lookup", "draft")):  # speculative off: not named
                shown = ", ".join(value) if isinstance(value, list) else f"{value:g}" if isinstance(value, float) \
                    else value
                assert md_form.format(shown) in section, (key, value, section)
    assert [len(c.run.ids) for c in v.columns] == [6, 6]
