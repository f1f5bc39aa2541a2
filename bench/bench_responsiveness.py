"""UI responsiveness: the chat view streaming a long reply, and the worker generating.

**View** (default): a 4,000-token Markdown reply (headings, lists, code blocks) streams into
the real ChatView of the real MainWindow, through the real Bridge, ReplyController and
frame pacing; a stand-in worker thread makes the tokens at ``--tok-s`` (no model, so only
the UI's cost is measured). A 5 ms QTimer records event-loop gaps; every ChatView update
is timed. Printed per mode, interleaved runs in separate processes:

* ``incremental``: the app as it is (only the end of the reply is re-rendered);
* ``full``: the peer, every update re-renders the whole reply as Markdown (the old way).

Goal: gaps ≤ 16 ms at p99 and ≤ 33 ms max over the whole reply, and per-update cost that
does not grow with the reply (shown near token 100, 1,000 and 4,000).

    python bench/bench_responsiveness.py [--tokens 4000] [--tok-s 400] [--repeats 2]

**Worker** (``--worker``): a 10 ms QTimer runs on the UI thread (qasync loop, offscreen) while the worker streams
from a random ~35M-parameter Llama built in-process (so generation runs at full speed)
through the real Bridge. Printed for each torch thread count:

* stall: gaps between timer ticks beyond their 10 ms period — max and 99th percentile —
  while idle, while a model loads (Meta folder, memory-mapped), and while generating;
* token → UI: delay from a token's creation on the worker thread to its arrival in the
  UI coroutine that iterates ``bridge.generate`` (coalescing included);
* decode speed, and chunks delivered per second (at most one a frame).

Each thread count runs in its own process (torch's thread pool is process-wide).

    python bench/bench_responsiveness.py --worker [--threads 1 2] [--seconds 6] [--repeats 2]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODEL = dict(dim=384, n_layers=6, n_heads=6, n_kv_heads=2, vocab_size=32000, hidden_dim=1024,
             max_seq_len=4096)
TICK_MS = 10


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def tick_timer():
    """A precise QTimer (not started) and the list its ticks are stamped into."""
    from PySide6.QtCore import Qt, QTimer

    ticks: list[float] = []
    timer = QTimer()
    timer.setTimerType(Qt.TimerType.PreciseTimer)
    timer.timeout.connect(lambda: ticks.append(time.perf_counter()))
    return timer, ticks


def tick_gaps(ticks: list[float], t0: float, t1: float) -> list[float]:
    ts = [t for t in ticks if t0 <= t <= t1]
    return [(b - a) * 1000 for a, b in zip(ts, ts[1:])]


def random_checkpoint(tmp_dir: str):
    """A random model saved as a Meta folder: (loaded model, folder, parameter count)."""
    import torch

    from core.prompt.chat_format import chat_format_for
    from core.checkpoints.common import LoadedModel
    from core.checkpoints.meta import save_meta
    from core.model.transformer import Transformer
    from core.model.args import ModelArgs
    from core.tokenizer import load_tokenizer

    fixtures = Path(os.environ.get("LLAMADESK_FIXTURES", ROOT.parent / "shared" / "fixtures"))
    tok_file = fixtures / "llama2-tokenizer.model"
    torch.manual_seed(0)
    args = ModelArgs(**MODEL)
    model = Transformer(args).eval().requires_grad_(False)
    tok = load_tokenizer(tok_file)
    fmt = chat_format_for(tok)
    loaded = LoadedModel(model, tok, fmt, args, set(tok.stop_ids) - {tok.eos_id},  # never stop early
                         {"name": "random", "context_length": args.max_seq_len})
    folder = save_meta(loaded, Path(tmp_dir) / "random", tokenizer_file=tok_file)
    params = sum(p.numel() for p in model.parameters())
    return loaded, folder, params


async def stream_reply(bridge, created: dict, seconds: float) -> dict:
    """Generate for ``seconds``; each token's delay from its creation to the UI, and counts."""
    from core.engine.settings import SamplingParams
    from core.engine.events import Done
    from core.worker.protocol import GenerateRequest
    from gui.bridge import Chunk

    req = GenerateRequest(mode="completion", prompt="Once upon a time",
                          params=SamplingParams(temperature=0.8, seed=1, max_new_tokens=100000))
    delays, chunks, tokens = [], 0, 0
    t_start = time.perf_counter()
    t_first = None
    done = None
    stream = bridge.generate(req)
    async for ev in stream:
        now = time.perf_counter()
        if isinstance(ev, Chunk):
            chunks += 1
            t_first = t_first or now
            for t in ev.tokens:
                delays.append((now - created.pop((stream.request_id, t.lane, t.index))) * 1000)
            tokens += len(ev.tokens)
            if now - t_start > seconds:
                stream.cancel()
        elif isinstance(ev, Done):
            done = ev
    return dict(delays=delays, chunks=chunks, tokens=tokens, t_start=t_start, t_first=t_first, done=done)


def stamping_factory(created: dict, threads: int):
    """A worker factory whose workers stamp each token's creation time into ``created``."""
    from core.engine.events import Token
    from core.worker.worker import Worker
    from core.engine.events import Reply

    def factory(on_event):
        def stamped(ev):
            if isinstance(ev, Reply) and isinstance(ev.event, Token):
                created[(ev.request_id, ev.event.lane, ev.event.index)] = time.perf_counter()
            on_event(ev)
        return Worker(stamped, torch_threads=threads)
    return factory


def gap_summary(g: list[float]) -> dict:
    return {"max_ms": max(g, default=float("nan")), "p99_ms": percentile(g, 99),
            "p50_ms": percentile(g, 50), "n": len(g)}


def child(threads: int, seconds: float) -> dict:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    import asyncio

    import qasync
    from PySide6.QtWidgets import QApplication

    from gui.bridge import Bridge

    tmp = tempfile.TemporaryDirectory()
    loaded, folder, params = random_checkpoint(tmp.name)

    app = QApplication.instance() or QApplication([])
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    created: dict[tuple[int, int, int], float] = {}

    bridge = Bridge(worker_factory=stamping_factory(created, threads))
    timer, ticks = tick_timer()
    timer.start(TICK_MS)

    async def scenario() -> dict:
        t0 = time.perf_counter()
        await asyncio.sleep(1.0)
        idle = tick_gaps(ticks, t0, time.perf_counter())
        t0 = time.perf_counter()
        await bridge.load(folder)
        load_s = time.perf_counter() - t0
        load_gaps = tick_gaps(ticks, t0, time.perf_counter())
        bridge.worker.adopt(loaded)  # the same model, with stop ids that never end early
        while bridge.model_info is None or bridge.model_info.get("name") != "random":
            await asyncio.sleep(0.01)
        s = await stream_reply(bridge, created, seconds)
        t_end = time.perf_counter()
        t_from = s["t_first"] or s["t_start"]
        gen = tick_gaps(ticks, t_from, t_end)
        await bridge.shutdown()
        delays, done = s["delays"], s["done"]
        return {
            "threads": threads, "params_M": params / 1e6, "cpus": os.cpu_count(),
            "idle": gap_summary(idle), "load": {**gap_summary(load_gaps), "seconds": load_s},
            "generate": gap_summary(gen),
            "token_to_ui_ms": {"p50": percentile(delays, 50), "p99": percentile(delays, 99),
                               "max": max(delays, default=float("nan"))},
            "decode_tok_s": done.stats.decode_tok_s if done else float("nan"),
            "tokens": s["tokens"], "chunks_per_s": s["chunks"] / max(t_end - t_from, 1e-9),
        }

    try:
        result = loop.run_until_complete(scenario())
    finally:
        timer.stop()
        loop.close()
        asyncio.set_event_loop(None)
        tmp.cleanup()
    return result


def markdown_reply(n_tokens: int) -> list[str]:
    """~n_tokens word-sized pieces of a Markdown reply: sections with a heading, a
    paragraph, a list and a fenced code block, repeated."""
    import re
    pieces: list[str] = []
    k = 0
    while len(pieces) < n_tokens:
        k += 1
        section = (f"## Step {k}: loading the data\n\n"
                   f"First we read the file and check every row, then we keep the ones that "
                   f"pass. This is section {k} of the walk-through, with **bold** and `code`.\n\n"
                   f"- open the file number {k}\n- read each line\n- skip the header\n  - and blanks\n\n"
                   f"```python\ndef step_{k}(path):\n    rows = []\n    with open(path) as f:\n"
                   f"        for line in f:\n            rows.append(line.split(','))\n    return rows\n```\n\n")
        # A word with the spaces and newlines after it (code keeps its indentation); the
        # pieces join to exactly the sections.
        pieces += re.findall(r"\S+\s*|\s+", section)
    return pieces[:n_tokens]


def stand_in_worker(pieces: list[str], tok_s: float):
    """A worker class that makes the reply's tokens at tok_s on its own thread, like the worker would."""
    import threading

    from core.engine.events import Done, Prefilled, Stats, Token
    from core.worker.protocol import Prompted
    from core.engine.events import Reply

    class StandInWorker:
        def __init__(self, on_event):
            self.on_event, self.alive, self.stop_flag = on_event, False, threading.Event()

        def start(self):
            self.alive = True

        def generate(self, request):
            def run():
                self.on_event(Prompted(1, 0, 8192))
                self.on_event(Reply(1, Prefilled(20, 0, 0.0)))
                t0 = time.perf_counter()
                for i, piece in enumerate(pieces):
                    if self.stop_flag.is_set():
                        break
                    delay = t0 + (i + 1) / tok_s - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                    self.on_event(Reply(1, Token(0, i, 5, piece, piece, -0.1)))
                text = "".join(pieces)
                self.on_event(Reply(1, Done(0, "length", [5] * len(pieces), text, [-0.1] * len(pieces),
                                            request.params, Stats(generated_tokens=len(pieces)))))
            threading.Thread(target=run, daemon=True).start()
            return 1

        def cancel(self, request_id):
            self.stop_flag.set()

        cancel_all = stop = lambda self, *a: self.stop_flag.set()

        def join(self, timeout=None):
            return True

        def shutdown(self, timeout=5.0):
            self.stop_flag.set()
    return StandInWorker


def render_fully() -> None:
    """The peer: the whole reply re-rendered as Markdown on every update."""
    from gui.chat import message as message_widget

    def append_text(self, delta):
        self.message["text"] = self.message.get("text", "") + delta
        self.body.set_markdown(self.message["text"])
    message_widget.MessageWidget.append_text = append_text


def gc_timer():
    """A gc callback and the (generation, ms) of each collection it timed."""
    gc_ms: list[tuple[int, float]] = []  # (generation, ms) of each collection while measuring
    gc_start: list[float] = []

    def on_gc(phase, info):
        if phase == "start":
            gc_start[:] = [time.perf_counter()]
        elif gc_start:
            gc_ms.append((info["generation"], (time.perf_counter() - gc_start[0]) * 1000))
    return on_gc, gc_ms


def open_window(bridge, tmp_dir: str, n_tokens: int):
    """The main window on a stand-in model, shown, with settings and history in ``tmp_dir``."""
    from PySide6.QtCore import QSettings

    from core.history.store import History
    from gui.main_window import MainWindow

    settings = QSettings(str(Path(tmp_dir) / "s.ini"), QSettings.IniFormat)
    window = MainWindow(bridge=bridge, history=History(Path(tmp_dir) / "h.sqlite3"), settings=settings,
                        autoload=False)
    window.resize(1200, 800)
    window.show()
    window.models.set_model({"name": "stand-in", "context_length": 8192})
    window.action("record_probs").setChecked(False)
    window.panel.maxTokensSpin.setValue(n_tokens)
    return window


def time_chat_view(window, n_tokens: int):
    """Time every ChatView update and the final render: (updates, final_ms)."""
    updates: list[tuple[int, float]] = []  # (tokens streamed so far, ms) per ChatView update
    append = window.chat.append_stream

    def timed_append(text):
        t = time.perf_counter()
        append(text)
        st = window.reply.state
        updates.append((st.tokens if st is not None else n_tokens, (time.perf_counter() - t) * 1000))
    window.reply.streamed.disconnect(window.chat.append_stream)
    window.reply.streamed.connect(timed_append)
    final_ms: list[float] = []  # the reply's final render (ChatView.end_stream)
    end_stream = window.chat.end_stream

    def timed_end(message):
        t = time.perf_counter()
        end_stream(message)
        final_ms.append((time.perf_counter() - t) * 1000)
    window.chat.end_stream = timed_end
    return updates, final_ms


def view_summary(mode: str, n_tokens: int, ticks: list[float], t0: float, t1: float, updates: list,
                 final_ms: list[float], gc_ms: list, final_text: str) -> dict:
    gaps = tick_gaps(ticks, t0, t1)
    ts = [t for t in ticks if t0 <= t <= t1]
    # The longest gaps and when they ended (ms before the reply finished): a stall at the
    # end is the final render's, one mid-reply a frame's (or the shared machine's).
    worst = sorted(((b - a) * 1000, (t1 - b) * 1000) for a, b in zip(ts, ts[1:]))[-3:][::-1]
    idle = tick_gaps(ticks, 0, t0)
    first_ms = updates[0][1] if updates else float("nan")

    def near(n):
        xs = [ms for k, ms in updates if 0.8 * n <= k <= 1.2 * n]
        return statistics.median(xs) if xs else float("nan")
    return {"mode": mode, "tokens": n_tokens, "seconds": t1 - t0, "updates": len(updates),
            "gap_p99_ms": percentile(gaps, 99), "gap_max_ms": max(gaps, default=float("nan")),
            "worst_gaps_ms_and_ms_before_end": worst,
            "idle_p99_ms": percentile(idle, 99), "idle_max_ms": max(idle, default=float("nan")),
            "first_update_ms": first_ms, "final_render_ms": final_ms[-1] if final_ms else float("nan"),
            "update_ms": {str(n): near(n) for n in (100, 1000, 4000)},
            "update_total_ms": sum(ms for _, ms in updates),
            "update_max_ms": max((ms for _, ms in updates), default=float("nan")),
            "gc_max_ms": {g: max((ms for gen, ms in gc_ms if gen == g), default=0.0) for g in (0, 1, 2)},
            "gc_count": {g: sum(gen == g for gen, _ in gc_ms) for g in (0, 1, 2)}, "final_chars": len(final_text)}


def view_child(mode: str, n_tokens: int, tok_s: float) -> dict:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    import asyncio
    import gc

    import qasync
    from PySide6.QtWidgets import QApplication

    from gui.app import UiThreadCollector
    from gui.bridge import Bridge

    StandInWorker = stand_in_worker(markdown_reply(n_tokens), tok_s)
    if mode == "full":
        render_fully()

    tmp = tempfile.TemporaryDirectory()
    app = QApplication.instance() or QApplication([])
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    collector = UiThreadCollector()  # garbage collection as the app does it (gui.app.run)
    collector.start()
    on_gc, gc_ms = gc_timer()
    bridge = Bridge(worker_factory=StandInWorker)
    window = open_window(bridge, tmp.name, n_tokens)
    updates, final_ms = time_chat_view(window, n_tokens)
    timer, ticks = tick_timer()

    async def scenario():
        await asyncio.sleep(0.5)
        finished = asyncio.Event()
        window.replyFinished.connect(lambda view: finished.set())
        timer.start(5)
        await asyncio.sleep(1.0)  # the same timer with nothing streaming: the machine's own noise
        gc.callbacks.append(on_gc)
        t0 = time.perf_counter()
        window.send("Walk me through loading the data.")
        await finished.wait()
        t1 = time.perf_counter()
        gc.callbacks.remove(on_gc)
        timer.stop()
        return t0, t1

    try:
        t0, t1 = loop.run_until_complete(scenario())
    finally:
        loop.run_until_complete(bridge.shutdown())
        window.close()
        loop.close()
        asyncio.set_event_loop(None)
        collector.stop()
    final_text = window.chat.widgets[-1].body.toPlainText()
    return view_summary(mode, n_tokens, ticks, t0, t1, updates, final_ms, gc_ms, final_text)


def view_main(a) -> None:
    runs: dict[str, list[dict]] = {"incremental": [], "full": []}
    for _ in range(a.repeats):
        for mode in runs:  # interleaved: the machine is shared
            out = subprocess.run([sys.executable, __file__, "--view-child", mode, "--tokens", str(a.tokens),
                                  "--tok-s", str(a.tok_s)], capture_output=True, text=True, cwd=ROOT)
            if out.returncode != 0:
                sys.exit(f"{mode} run failed:\n{out.stderr[-3000:]}")
            runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    if a.json:
        print(json.dumps(runs))
        return
    print(f"{a.tokens}-token Markdown reply at {a.tok_s:g} tok/s into the main window's ChatView (offscreen, "
          f"{os.cpu_count()} cores, shared machine); {a.repeats} run(s) per mode, interleaved, median shown")
    print(f"{'mode':>12} | {'idle p99/max':>12} | {'gap p99 ms':>10} | {'gap max ms':>10} | {'first update':>12} | "
          f"{'update ms @100':>14} | "
          f"{'@1000':>7} | {'@4000':>7} | {'final render':>12} | {'UI ms in updates':>16} | {'updates':>7}")
    med = statistics.median
    for mode, rs in runs.items():
        u = lambda n: med(r["update_ms"][str(n)] for r in rs)  # noqa: E731
        print(f"{mode:>12} | {med(r['idle_p99_ms'] for r in rs):>5.1f}/{med(r['idle_max_ms'] for r in rs):>6.1f} | "
              f"{med(r['gap_p99_ms'] for r in rs):>10.1f} | {med(r['gap_max_ms'] for r in rs):>10.1f} | "
              f"{med(r['first_update_ms'] for r in rs):>12.1f} | "
              f"{u(100):>14.2f} | {u(1000):>7.2f} | {u(4000):>7.2f} | "
              f"{med(r['final_render_ms'] for r in rs):>12.1f} | "
              f"{med(r['update_total_ms'] for r in rs):>16.0f} | {med(r['updates'] for r in rs):>7.0f}")
    inc, full = runs["incremental"], runs["full"]
    print(f"per-update cost at 4000 tokens, full / incremental: "
          f"{med(r['update_ms']['4000'] for r in full) / med(r['update_ms']['4000'] for r in inc):.0f}x; "
          "goal: gap p99 ≤ 16 ms, max ≤ 33 ms, update cost flat in length")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help="measure the worker's stalls per torch thread count")
    ap.add_argument("--tokens", type=int, default=4000, help="view: reply length in tokens")
    ap.add_argument("--tok-s", type=float, default=400.0, help="view: tokens made per second")
    ap.add_argument("--view-child", choices=["incremental", "full"], help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--seconds", type=float, default=6.0, help="generation time per run")
    ap.add_argument("--repeats", type=int, default=2, help="runs per thread count (interleaved)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()
    if a.view_child:
        print(json.dumps(view_child(a.view_child, a.tokens, a.tok_s)))
        return
    if a.child:
        print(json.dumps(child(a.child, a.seconds)))
        return
    if not a.worker:
        view_main(a)
        return
    runs: dict[int, list[dict]] = {n: [] for n in a.threads}
    for _ in range(a.repeats):
        for n in a.threads:
            out = subprocess.run([sys.executable, __file__, "--child", str(n), "--seconds", str(a.seconds)],
                                 capture_output=True, text=True, cwd=ROOT)
            if out.returncode != 0:
                sys.exit(f"child with {n} threads failed:\n{out.stderr[-3000:]}")
            runs[n].append(json.loads(out.stdout.strip().splitlines()[-1]))
    if a.json:
        print(json.dumps(runs))
        return
    first = next(iter(runs.values()))[0]
    print(f"model: random Llama, {first['params_M']:.1f}M params, float32, CPU ({first['cpus']} cores); "
          f"QTimer every {TICK_MS} ms; {a.repeats} run(s) per setting, worst shown")
    print(f"{'threads':>7} | {'decode tok/s':>12} | {'gen gap max/p99 ms':>20} | {'load gap max/p99 ms':>21} | "
          f"{'idle max':>8} | {'token→UI p50/p99/max ms':>23} | {'chunks/s':>8}")
    for n, rs in runs.items():
        w = lambda k, f: max(r[k][f] for r in rs)  # noqa: E731 — worst of the repeats
        tok_s = statistics.median(r["decode_tok_s"] for r in rs)
        print(f"{n:>7} | {tok_s:>12.0f} | {w('generate', 'max_ms'):>9.1f} / {w('generate', 'p99_ms'):>7.1f} | "
              f"{w('load', 'max_ms'):>10.1f} / {w('load', 'p99_ms'):>7.1f} | {w('idle', 'max_ms'):>8.1f} | "
              f"{w('token_to_ui_ms', 'p50'):>6.1f} / {w('token_to_ui_ms', 'p99'):>5.1f} / "
              f"{w('token_to_ui_ms', 'max'):>6.1f} | {statistics.median(r['chunks_per_s'] for r in rs):>8.1f}")
    print("gap = time between ticks of a 10 ms timer (10 = no stall); goal: max gap ≤ 50 ms while generating")


if __name__ == "__main__":
    main()
