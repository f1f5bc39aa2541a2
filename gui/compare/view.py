"""Side-by-side comparison of sampler settings: lanes that stream together.

One prompt (or the open conversation as context) runs under 1–8 lanes of settings in
one batched request (``bridge.compare``); each lane is a column that streams live, shows
its numbers (tokens, tokens/s, stop reason, mean log-prob, perplexity, distinct-n), and
renders every token as an anchor so it can be inspected, diffed against a baseline lane
and shaded by probability. Comparisons are saved in the history with the seeds really
used, reopen from the "Saved" menu, re-run exactly and export to Markdown and JSON.

The window composes its parts: :mod:`gui.compare.controls` (prompt row, action bar, lanes
area), :mod:`gui.compare.lane_column` (one lane), :mod:`gui.compare.sweep_row`,
:mod:`gui.compare.runner` (running, no widgets), :mod:`gui.compare.model_picker` and
:mod:`gui.compare.models` (what lanes run on), :mod:`gui.compare.records` (saving, exporting,
adopting); :mod:`gui.compare.launch` opens it from the main window. The view never touches
torch: all numbers come from the worker's events.
"""
from __future__ import annotations

import asyncio
import random
from typing import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import QFileDialog, QLabel, QSplitter, QVBoxLayout, QWidget

from core.engine.lanes import LANE_KEYS, MAX_LANES, settings_label
from core.engine.settings import SamplingParams
from core.errors import LlamaDeskError
from core.worker.protocol import CompareRequest

from gui import theme
from gui.compare import records
from gui.compare.controls import ActionBar, LanesArea, PromptRow, lane_inspector
from gui.compare.lane_column import LaneColumn
from gui.compare.model_picker import LaneModelPicker
from gui.compare.lanes import ban_text
from gui.compare.models import LaneModel, ModelShelf, loaded_model_from, tokenizers_match
from gui.compare.runner import (ComparisonRunner, LaneJob, base_request, branch_refusal, branch_spec, refusals,
                               running_line, seed_changes)
from gui.compare.sweep_row import SweepRow
from gui.compare.sweeper import LaneSet, LaneSweep
from gui.widgets.token_run import lane_colors

DEFAULT_INSPECT = 5


class CompareView(QWidget):
    """The comparison window (objectName ``compareView``).

    Signals:
        adoptRequested(str, dict): a lane's reply should join the chat (text, and a dict
            with settings, seed, stats, stop_reason, lane); emitted by :meth:`adopt`
            after it wrote the reply through ``conversation`` when one was given.

    Args:
        bridge: the :class:`gui.bridge.Bridge` (its ``compare`` and ``cancel``).
        history: the :class:`core.history.store.History` comparisons are saved in.
        prompt: the prompt text to start with.
        messages: the conversation so far, offered as context (chat mode).
        lanes: settings of the starting lanes (SamplingParams or dicts); default one lane.
        mode: "chat" or "completion"; chat_format: the override sent with the request.
        conversation: a :class:`gui.chat.conversation.ConversationModel` that "Adopt" writes to.
        token_text: id -> text, to name the inspector's alternatives (the loaded model's
            tokenizer; lanes on other tokenizers use the names their tokens carry).
        inspect: alternatives recorded per token (the worker's ``inspect``).
        models: the models lanes can run on (:class:`LaneModel`); default the loaded one.
        lane_models: each starting lane's model (default the first of ``models``).
        server_dialog: ``factory(parent) -> dialog`` whose ``connected(RemoteModel)`` signal gives
            a connected server's model ("Model on a server…"); None: that entry says how.
    """

    adoptRequested = Signal(str, dict)

    def __init__(self, *, bridge, history, prompt: str = "", messages: list[dict] | None = None,
                 lanes: list | None = None, mode: str = "chat", chat_format: str = "auto",
                 conversation=None, token_text: Callable[[int], str | None] | None = None,
                 inspect: int = DEFAULT_INSPECT, models: list[LaneModel] | None = None,
                 lane_models: list[LaneModel] | None = None, server_dialog: Callable[[], object] | None = None,
                 tools: list[dict] = (), parent=None):
        super().__init__(parent)
        self.setObjectName("compareView")
        self.setAccessibleName("Compare sampling settings")
        self.setWindowTitle("Compare settings and models — LlamaDesk")
        self.bridge, self.history, self.conversation = bridge, history, conversation
        self.inspect = int(inspect)
        self.chat_format = chat_format
        lanes = [s.to_dict() if isinstance(s, SamplingParams) else dict(s) for s in lanes or [SamplingParams()]]
        self.stop_strings: tuple[str, ...] = tuple(lanes[0].get("stop") or ())  # shared by every lane
        self.columns: list[LaneColumn] = []
        self.baseline = 0
        self.selected: tuple[int, int] | None = None
        self.saved_id: int | None = None
        self.last_prompt: dict | None = None  # the prompt of the shown results
        self.renders = 0  # how many times lanes were re-rendered (tests check throttling)
        self._token_text = token_text
        self._task: asyncio.Task | None = None
        self._running: dict[LaneJob, LaneColumn] = {}
        self.shelf = ModelShelf(models or [loaded_model_from(getattr(bridge, "model_info", None))])
        self.models = self.shelf.models  # the same list: what the lanes' model combos offer
        self.runner = ComparisonRunner(bridge, self.shelf, self)
        self.runner.laneFailed.connect(lambda job, notice: self._running[job].show_notice(notice))
        self.runner.progress.connect(lambda text: self.status.setText(text))
        self.runner.frame.connect(self.render)
        self.picker = LaneModelPicker(bridge, self.shelf, server_dialog, self, lambda: self.columns)
        self.picker.chosen.connect(self._picked)
        self.picker.status.connect(lambda text: self.status.setText(text))
        self._tools = list(tools)  # the chat's tools (OpenAI-shaped): every chat-mode lane is offered them
        self._build(prompt, mode, list(messages or []), token_text)
        for i, s in enumerate(lanes):
            self.add_lane(s, model=lane_models[i] if lane_models and i < len(lane_models) else None)
        self._refresh()
        self.resize(1280, 760)

    # ------------------------------------------------------------------ layout
    def _build(self, prompt: str, mode: str, context: list[dict], token_text) -> None:
        root = QVBoxLayout(self)
        root.setContentsMargins(8, 8, 8, 6)
        root.setSpacing(6)
        self.prompt_row = PromptRow(prompt, mode, context, tools=self._tools)
        root.addWidget(self.prompt_row)
        self.bar = ActionBar({
            "run": self.run, "stop": self.stop, "rerun": lambda: self.run(again=True),
            "new_seeds": lambda: self.run(new_seeds=True), "add_lane": lambda: self.add_lane(),
            "sweep": self._toggle_sweep, "seed_lock": self._seed_lock_toggled, "baseline": self._baseline_chosen,
            "heatmap": lambda *_: self.render(all_lanes=True), "save": lambda: self.save(),
            "fill_saved": self.fill_saved_menu, "export": self.export})
        root.addWidget(self.bar)
        self.sweep_row = SweepRow()
        self.sweeper = LaneSweep(self, self.sweep_row)  # Make lanes (asks what to keep) and Undo
        self.sweep_row.setVisible(False)
        root.addWidget(self.sweep_row)
        root.addWidget(self._lanes_and_inspector(token_text), 1)
        self.status = QLabel("Set up the lanes and press Run.")
        self.status.setObjectName("compareStatus")
        self.status.setWordWrap(True)
        root.addWidget(self.status)
        QShortcut(QKeySequence("Ctrl+Return"), self, activated=self.run)
        QShortcut(QKeySequence("Ctrl+Enter"), self, activated=self.run)
        QShortcut(QKeySequence("Esc"), self, activated=self.stop)

    def _lanes_and_inspector(self, token_text) -> QSplitter:
        self.splitter = QSplitter(Qt.Horizontal)
        self.scroll = LanesArea()
        self.inspector = lane_inspector(token_text)
        self.inspector.branchRequested.connect(lambda lane, i, tok: self.branch_lane(lane, i, tok))
        self.inspector.banRequested.connect(lambda lane, i, tok: self.ban_in_lane(lane, i, tok))
        self.splitter.addWidget(self.scroll)
        self.splitter.addWidget(self.inspector)
        self.splitter.setStretchFactor(0, 1)
        self.splitter.setStretchFactor(1, 0)
        self.splitter.setSizes([1000, 270])
        return self.splitter

    # ------------------------------------------------------------------ lanes
    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def lane_count(self) -> int:
        return len(self.columns)

    def add_lane(self, settings: dict | None = None, at: int | None = None,
                 model: LaneModel | None = None) -> LaneColumn | None:
        """Add a lane (default: a copy of the last lane's settings and model); None when full or running."""
        if len(self.columns) >= MAX_LANES or self.running:
            return None
        if model is None:
            model = self.columns[-1].model if self.columns and settings is None else self.models[0]
        if settings is None:
            settings = self.columns[-1].settings() if self.columns else SamplingParams().to_dict()
        full = {**SamplingParams().to_dict(), **settings}  # unset keys: the sampler's defaults
        col = LaneColumn(settings={k: v for k, v in full.items() if k in LANE_KEYS})
        col.moveRequested.connect(lambda step, c=col: self.move_lane(self.columns.index(c), step))
        col.duplicateRequested.connect(lambda c=col: self.duplicate_lane(self.columns.index(c)))
        col.removeRequested.connect(lambda c=col: self.remove_lane(self.columns.index(c)))
        col.adoptRequested.connect(lambda c=col: self.adopt(self.columns.index(c)))
        col.settingsChanged.connect(lambda c=col: self._settings_edited(c))
        col.tokenHovered.connect(self._token_hovered)
        col.tokenClicked.connect(self._token_clicked)
        col.modelChosen.connect(lambda index, c=col: self.picker.choose(c, index))
        col.set_models(self.models, model)
        col.tools.set_tools([str((t.get("function") or {}).get("name", "")) for t in self._tools])
        self.columns.insert(len(self.columns) if at is None else at, col)
        self._relayout()
        return col

    def duplicate_lane(self, i: int) -> None:
        self.add_lane(self.columns[i].settings(), at=i + 1, model=self.columns[i].model)

    def remove_lane(self, i: int) -> None:
        if len(self.columns) <= 1 or self.running:
            return
        col = self.columns.pop(i)
        col.setParent(None)
        col.deleteLater()
        if self.baseline == i:
            self.baseline = 0
        elif self.baseline > i:
            self.baseline -= 1
        self.selected = None
        self.inspector.clear()
        self._relayout()

    def move_lane(self, i: int, step: int) -> None:
        j = i + step
        if self.running or not (0 <= i < len(self.columns) and 0 <= j < len(self.columns)):
            return
        self.columns[i], self.columns[j] = self.columns[j], self.columns[i]
        if self.baseline in (i, j):
            self.baseline = j if self.baseline == i else i
        self.selected = None
        self._relayout()

    def set_lanes(self, settings: list[dict], models: list[LaneModel] | None = None) -> None:
        """Replace all lanes (settings and models; results are cleared). Without ``models``
        every lane keeps the first lane's model."""
        if self.running:
            return
        keep = self.columns[0].model if self.columns else self.models[0]
        for col in self.take_lanes().columns:
            col.deleteLater()
        for i, s in enumerate(settings[:MAX_LANES]):
            self.add_lane(s, model=models[i] if models and i < len(models) else keep)
        self._relayout()

    def take_lanes(self, keep_shown: bool = False) -> LaneSet:
        """Every lane, whole (columns with their results, branches and models): taken out of
        the window, or only named (``keep_shown``), to show again with :meth:`put_lanes`."""
        taken = LaneSet(list(self.columns), self.baseline, self.saved_id, self.last_prompt)
        if not keep_shown:
            for col in self.columns:
                col.setParent(None)
            self.columns, self.baseline, self.selected = [], 0, None
            self.inspector.clear()
        return taken

    def put_lanes(self, lanes: LaneSet) -> LaneSet:
        """Show ``lanes`` (from :meth:`take_lanes`) in place of the lanes shown; returns those."""
        shown = self.take_lanes()
        self.columns, self.baseline = list(lanes.columns), lanes.baseline
        self.saved_id, self.last_prompt = lanes.saved_id, lanes.last_prompt
        self._relayout()
        return shown

    def lane_settings(self) -> list[dict]:
        """Every lane's settings as shown (seeds None where "random")."""
        out = [{**c.settings(), "stop": list(self.stop_strings)} for c in self.columns]
        if self.bar.seed_lock.isChecked() and out:
            out = [{**s, "seed": out[0]["seed"]} for s in out]
        return out

    def _relayout(self) -> None:
        self.scroll.show_lanes(self.columns)
        # Result runs keep their lane numbers in anchors: re-render under the new index.
        self._refresh()
        self.render(all_lanes=True)

    def _refresh(self) -> None:
        """Names, titles, enabled states and the baseline list after any change."""
        n = len(self.columns)
        self.baseline = min(self.baseline, max(n - 1, 0))
        self.bar.set_baselines(n, self.baseline)
        running = self.running
        locked = self.bar.seed_lock.isChecked()
        if locked and self.columns:
            seed = self.columns[0].settings()["seed"]
            for col in self.columns[1:]:
                col.set_settings({"seed": seed})
        for i, col in enumerate(self.columns):
            col.set_index(self.columns, i == self.baseline)
            col.set_editable(not running, locked)
        self.bar.set_state(running, n, any(c.run is not None for c in self.columns))
        self.sweep_row.set_enabled(not running)

    def _settings_edited(self, col: LaneColumn) -> None:
        if self.bar.seed_lock.isChecked() and self.columns and col is self.columns[0]:
            self._refresh()
        base = self.columns[self.baseline].settings() if self.columns else None
        for i, c in enumerate(self.columns):  # an edit of the baseline changes every summary
            if c.run is None:
                c.divergence.setText(self._summary(i, c, base))

    def _summary(self, i: int, col: LaneColumn, base_settings: dict | None) -> str:
        """A lane without results: how its settings differ from the baseline's ('T 2')."""
        return settings_label(col.settings(), base_settings) if i != self.baseline else ""

    def _seed_lock_toggled(self, on: bool) -> None:
        if on and self.columns and self.columns[0].settings()["seed"] is None:
            # A lock on "random" would give each lane its own draw: pick the shared seed now.
            self.columns[0].set_settings({"seed": random.randrange(2**31)})
        self._refresh()

    def _baseline_chosen(self, index: int) -> None:
        if index >= 0:
            self.baseline = index
            self._refresh()
            self.render(all_lanes=True)

    def _toggle_sweep(self, on: bool) -> None:
        self.sweep_row.setVisible(on)
        if on:
            self.sweep_row.values.setFocus()

    def apply_sweep(self, param: str | None = None, values: str | None = None, mode: str | None = None) -> bool:
        """One lane per value of ``param`` (default: the sweep row's); see :class:`LaneSweep`."""
        return self.sweeper.apply(param, values, mode)

    # ------------------------------------------------------------------ models
    def model_of(self, lane: int) -> LaneModel:
        return self.columns[lane].model or self.models[0]

    def set_lane_model(self, lane: int, model: LaneModel) -> None:
        """Run ``lane`` on ``model`` (added to the models offered); its old results go."""
        if self.running:
            return
        self.shelf.add(model)
        col = self.columns[lane]
        if col.model is not model:
            col.run = None
            self.selected = None
        col.model = model
        col.show_notice("")
        self.picker.offer()
        self._refresh()
        self.render(all_lanes=True)

    def add_server(self, remote) -> LaneModel:
        """A connected :class:`core.remote.client.RemoteModel` as a lane model (once per server and model)."""
        return self.picker.add_server(remote)

    def open_checkpoint(self, lane: int, path: str) -> asyncio.Task | None:
        """Load ``path`` beside the app's model (memory checked as for a load) and run
        ``lane`` on it; a failure is shown in the lane. Returns the task."""
        if self.running or not 0 <= lane < len(self.columns):
            return None
        return self.picker.open_checkpoint(self.columns[lane], path)

    def _picked(self, col: LaneColumn, model: LaneModel) -> None:
        if col in self.columns:
            self.set_lane_model(self.columns.index(col), model)

    # ------------------------------------------------------------------ running
    def run(self, *, again: bool = False, new_seeds: bool = False,
            only: list[LaneColumn] | None = None) -> asyncio.Task | None:
        """Start the comparison; ``again`` re-runs the shown results' exact settings,
        ``new_seeds`` draws fresh seeds first; ``only``: run just these lanes (the others
        keep their results). Returns the task (None if not started)."""
        if self.running:
            return None
        for col, change in zip(self.columns, seed_changes([c.run for c in self.columns], again=again,
                                                          new_seeds=new_seeds, locked=self.bar.seed_lock.isChecked())):
            if change:
                col.set_settings(change)
        prompt = self.prompt_row.prompt(self.chat_format)
        if not prompt["text"].strip() and not prompt.get("messages"):
            self.status.setText("Write a prompt first.")
            return None
        try:
            params = [SamplingParams.from_dict(s).validate() for s in self.lane_settings()]
        except LlamaDeskError as e:
            self.status.setText(f"Settings: {e}")
            return None
        targets = [i for i, c in enumerate(self.columns) if only is None or c in only]
        jobs = [LaneJob(i + 1, self.model_of(i), params[i], self.columns[i].branch,
                        documents=self.columns[i].documents.spec()) for i in targets]
        notices, refused = refusals(jobs)
        if refused:
            for k, notice in notices.items():
                self.columns[targets[k]].show_notice(notice)
            self.status.setText(refused)
            return None
        self.sweeper.forget()  # Undo would now drop these results
        self._running = {job: self.columns[i] for job, i in zip(jobs, targets)}
        for job, col in self._running.items():
            col.run = job.run
            col.show_notice("")
        if only is None or self.last_prompt is None:
            self.last_prompt = prompt
        self.saved_id = None
        self.selected = None
        self.inspector.clear()
        self._task = asyncio.ensure_future(self._run(base_request(prompt, self.inspect), jobs))
        self._refresh()
        self.render(all_lanes=True)
        self.status.setText(running_line(jobs))
        return self._task

    async def _run(self, base: CompareRequest, jobs: list[LaneJob]) -> None:
        try:
            failed = await self.runner.run(base, jobs)
        finally:
            self._task = None
            self.render(all_lanes=True)
            self._refresh()
        if failed:
            self.status.setText("Error: " + " · ".join(failed))
        else:
            self.status.setText("Done · " + " · ".join(
                f"lane {self.columns.index(c) + 1}: {c.run.stop_reason or '?'}"
                for c in self._running.values() if c.run is not None and c in self.columns))

    def stop(self) -> None:
        if self.running:
            self.runner.stop()
            self.status.setText("Stopping…")

    # ------------------------------------------------------------------ rendering
    def render(self, all_lanes: bool = True) -> None:
        """Re-render the lanes' HTML, divergence labels and stats (while streaming, once
        per batch of events the bridge delivers: at most once a frame)."""
        self.renders += 1
        colors = lane_colors(theme.colors(), theme.is_dark())
        base = self.columns[self.baseline].run if self.columns and self.baseline < len(self.columns) else None
        base_settings = self.columns[self.baseline].settings() if self.columns else None
        heatmap, following, locked = self.bar.heatmap_check.isChecked(), self.running, self.bar.seed_lock.isChecked()
        for i, col in enumerate(self.columns):
            if col.run is None:
                col.show_unrun(self._summary(i, col, base_settings), colors)
                continue
            match = tokenizers_match(self.model_of(self.baseline), self.model_of(i)) if base is not None else None
            col.show_run(self.columns, baseline=i == self.baseline, base=base, match=match, colors=colors,
                         heatmap=heatmap, selected=self.selected[1] if self.selected and self.selected[0] == i else None,
                         following=following)
            col.set_editable(not following, locked)

    # ------------------------------------------------------------------ inspector
    def token(self, lane: int, index: int):
        if 0 <= lane < len(self.columns):
            run = self.columns[lane].run
            if run is not None and 0 <= index < len(run.tokens):
                return run.tokens[index]
        return None

    def inspect_token(self, lane: int, index: int, *, pin: bool = True) -> bool:
        """Show token ``index`` of ``lane`` in the inspector (pinned: highlighted too)."""
        rec = self.token(lane, index)
        if rec is None:
            return False
        settings = self.columns[lane].run.params or self.columns[lane].settings()
        model = self.model_of(lane)
        # Name alternatives in this lane's own vocabulary: the loaded model's tokenizer only
        # for lanes that share it, else the pieces this lane's tokens carried.
        names = self.shelf.names_for(model)
        names.update({int(k): v for k, v in ((rec.top or {}).get("pieces") or {}).items()})
        self.inspector.known = names
        loaded = self.shelf.loaded()
        self.inspector.token_text = self._token_text if loaded is not None and tokenizers_match(model, loaded) else None
        label = settings_label(settings)
        if len({self.model_of(i).group for i in range(len(self.columns))}) > 1:
            label = f"{model.label()} · {label}"
        self.inspector.show_token(lane, index, rec, label)
        if pin:
            self.selected = (lane, index)
            self.render(all_lanes=True)
        return True

    def branch_lane(self, lane: int, index: int, token_id: int) -> asyncio.Task | None:
        """"Continue with X": a new lane with ``lane``'s settings (the seed it used) that
        keeps its tokens before ``index``, takes ``token_id`` there and carries on. Runs
        it at once (the other lanes keep their results); returns the task."""
        col = self.columns[lane] if 0 <= lane < len(self.columns) else None
        run = col.run if col is not None else None
        why = "wait for the lanes to finish" if self.running else branch_refusal(
            run, index, token_id, len(self.columns), self.model_of(lane) if col is not None else self.models[0])
        if why:
            self.status.setText(f"Cannot branch: {why}.")
            return None
        settings = {k: v for k, v in (run.params or col.settings()).items() if k in LANE_KEYS}
        new = self.add_lane(settings, model=self.model_of(lane))
        new.branch = branch_spec(col, lane + 1, run, index, int(token_id), self.model_of(lane))
        new.documents.set_spec(col.documents.spec())  # its kept tokens answered that grounding
        self._refresh()
        task = self.run(only=[new])
        name = self.inspector.text_of(int(token_id))
        self.status.setText(f"Lane {len(self.columns)}: lane {lane + 1} up to token {index + 1}, then “{name}”…")
        return task

    def ban_in_lane(self, lane: int, index: int, token_id: int) -> bool:
        """"Ban X": add TEXT=-inf for the token to ``lane``'s logit bias (its text as the
        lane's tokenizer would encode it alone); it applies from the next Run."""
        if self.running or not 0 <= lane < len(self.columns) or token_id < 0:
            return False
        model = self.model_of(lane)
        piece = ban_text(self.token(lane, index), int(token_id), self.shelf.names_for(model), model.dummy_prefix)
        if not piece:
            self.status.setText("Cannot ban that token by text (it is only space or has no text).")
            return False
        self.columns[lane].add_bias(f"{piece}=-inf")
        self.status.setText(f"Lane {lane + 1} now bans “{piece}” (press Run to see it).")
        return True

    def _token_clicked(self, lane: int, index: int) -> None:
        if self.selected == (lane, index):
            self.selected = None
            self.render(all_lanes=True)
            return
        self.inspect_token(lane, index, pin=True)

    def _token_hovered(self, lane: int, index: int) -> None:
        if lane >= 0:
            self.inspect_token(lane, index, pin=False)
        elif self.selected is not None:
            self.inspect_token(*self.selected, pin=False)

    # ------------------------------------------------------------------ keeping it
    def comparison_data(self) -> tuple[dict, list[dict]]:
        """The comparison as History.save_comparison takes it: the prompt, and each lane."""
        prompt = {**(self.last_prompt or self.prompt_row.prompt(self.chat_format)), "inspect": self.inspect}
        return prompt, [records.lane_record(col.run, {**col.settings(), "stop": list(self.stop_strings)},
                                            self.model_of(i), col.branch, col.branch_source(self.columns)
                                            if col.branch else None, col.documents.spec())
                        for i, col in enumerate(self.columns)]

    def save(self, title: str | None = None) -> int | None:
        """Save the shown results (settings with the seeds used); returns the conversation id."""
        if self.running or not any(c.run is not None for c in self.columns):
            return None
        if self.saved_id is not None and title is None:
            return self.saved_id
        prompt, lanes = self.comparison_data()
        title = records.title_for(prompt) if title is None else title
        self.saved_id = self.history.save_comparison(title, prompt, lanes).id
        self.status.setText(f"Saved as “{title}”.")
        return self.saved_id

    def fill_saved_menu(self) -> None:
        """The "Saved" menu: the latest 30 saved comparisons (filled as it opens)."""
        self.bar.fill_saved(self.history.conversations(kind="comparison")[:30], self.open_comparison)

    def open_comparison(self, conv_id: int) -> None:
        """Show a saved comparison: its prompt, lanes (settings and seeds used) and results."""
        if self.running:
            return
        data = self.history.comparison(conv_id)
        prompt = data.get("prompt") or {}
        lanes = data.get("lanes") or []
        self.prompt_row.show_prompt(prompt, records.context_of(prompt))
        self._tools = list(self.prompt_row.tools)  # its lanes are offered the tools it was saved with
        self.chat_format = prompt.get("chat_format", self.chat_format)
        self.bar.seed_lock.blockSignals(True)
        self.bar.seed_lock.setChecked(False)
        self.bar.seed_lock.blockSignals(False)
        settings = [dict(l.get("settings") or {}) for l in lanes]
        self.stop_strings = tuple((settings[0] if settings else {}).get("stop") or ())
        self.set_lanes(settings, [self.shelf.from_record(l.get("model")) for l in lanes])
        for col, lane in zip(self.columns, lanes):
            col.run = records.run_from_record(lane)
            col.documents.set_spec(records.documents_of(lane))
            col.branch = records.branch_from_record(lane, col.run, self.columns)
        for t in (t for col in self.columns if col.run is not None for t in col.run.tokens):
            self.inspector.learn(t.token_id, t.piece)
        self.last_prompt = dict(prompt)
        self.saved_id = conv_id
        self._refresh()
        self.render(all_lanes=True)
        self.status.setText(f"Opened “{self.history.conversation(conv_id).title}” — Run repeats it exactly.")

    def ask_export_path(self, kind: str) -> str | None:
        """Where to export (a file dialog; tests replace this)."""
        filt = "Markdown (*.md)" if kind == "md" else "JSON (*.json)"
        path, _ = QFileDialog.getSaveFileName(self, "Export comparison", f"comparison.{kind}", filt)
        return path or None

    def export(self, kind: str, path: str | None = None) -> str | None:
        """Save (if needed) and write the comparison as Markdown ("md") or JSON ("json")."""
        conv_id = self.save()
        if conv_id is None:
            return None
        path = path or self.ask_export_path(kind)
        if not path:
            return None
        records.export_comparison(self.history, conv_id, kind, path)
        self.status.setText(f"Exported to {path}")
        return path

    # ------------------------------------------------------------------ adopt
    def adopt(self, lane: int) -> dict | None:
        """Put lane's reply into the chat: through ``conversation`` when given (the prompt
        as a user message first, unless the reply answers the conversation's last
        message), then ``adoptRequested``. Returns the info dict."""
        if not 0 <= lane < len(self.columns):
            return None
        run = self.columns[lane].run
        if run is None or not run.finished or not run.text:
            return None
        settings = dict(run.params or self.columns[lane].settings())
        info = {"settings": settings, "seed": settings.get("seed"), "stats": run.stats(),
                "stop_reason": run.stop_reason, "lane": lane}
        if self.conversation is not None:
            info["message_id"] = records.adopt_into(self.conversation, self.last_prompt or self.prompt_row.prompt(
                self.chat_format), run, info, self.model_of(lane), self.saved_id)
        self.status.setText(f"Lane {lane + 1}'s reply was added to the chat.")
        self.adoptRequested.emit(run.text, info)
        return info

    def closeEvent(self, event) -> None:
        self.stop()
        self.picker.release_held()
        super().closeEvent(event)
