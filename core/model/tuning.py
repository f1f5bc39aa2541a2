"""CPU compute dtype and thread counts chosen by measuring this machine's kernels.

Whether bfloat16 beats float32 on a CPU depends on the CPU (AVX-512 BF16 or AMX make
it 1.1-3x faster; without them bf16 prefill ran at 0.15x), and whether a second thread
helps decode depends on how busy the machine is. So ``auto`` asks :func:`cpu_choice`,
which runs a short probe (a decode-like one-row multiply and a prefill-like 128-row one,
in both dtypes and at 1 and N threads) once, and caches the result in the data folder
keyed by a fingerprint of the CPU, its core count and the torch version.

Threads follow the hardware (physical cores, for prefill and decode alike) unless a probe
taken on a quiet machine showed more threads clearly slower. A probe is a second of timings:
taken while the machine was busy (the app loading, a build running) it once measured two
threads slower than one and pinned every later run to one thread. So the load at probe time
is kept with the result, a busy probe's thread timings are not trusted, and a busy probe is
measured again at the next start that finds the machine quiet.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from core.paths import data_dir

CACHE_NAME = "cpu_probe.json"
DTYPE_ENV = "LLAMADESK_CPU_DTYPE"  # float32 / bfloat16: skip the probe (tests, scripts)
PROBE_VERSION = 3  # a cache written by another version of the probe is measured again
QUIET_LOAD = 0.25  # 1-minute load average per core under which a probe's timings are trusted
# N threads must take this much of 1 thread's time or more before decode or prefill drops to
# one thread: timing noise on a quiet machine stays within ~10%.
SLOWER = 1 / 0.85


@dataclass
class CpuChoice:
    """What ``auto`` uses on this CPU, with the measurements that decided it."""
    dtype: str  # 'float32' or 'bfloat16'
    prefill_threads: int
    decode_threads: int
    bf16_decode_speedup: float  # float32 time / bfloat16 time, one-row multiply
    bf16_prefill_speedup: float  # the same for 128 rows
    fingerprint: str
    measured: str  # when (UTC), or 'override'
    # time at 1 thread / time at the most threads, in the chosen dtype (0: not measured)
    prefill_thread_speedup: float = 0.0
    decode_thread_speedup: float = 0.0
    max_threads: int = 1
    version: int = 1
    load: float = -1.0  # load average per core while probing (-1: this OS does not say)

    @property
    def quiet(self) -> bool:
        """Whether the probe ran on a quiet machine (or one that cannot say), so its thread
        timings describe the hardware rather than whatever else was running."""
        return self.load < QUIET_LOAD

    @property
    def reason(self) -> str:
        if self.measured == "override":
            return f"{self.dtype}: set by {DTYPE_ENV}"
        return (f"{self.dtype}: probe of this CPU ({self.measured}): bfloat16 decode "
                f"{self.bf16_decode_speedup:.2f}x, prefill {self.bf16_prefill_speedup:.2f}x of float32")


def fingerprint() -> str:
    """CPU model and flags, core count and torch version: a new machine probes again."""
    cpu = platform.processor() or platform.machine()
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = line.split(":", 1)[1].strip()
    except OSError:
        pass
    raw = f"{cpu}|{flags}|{os.cpu_count()}|{torch.__version__}|{sys.platform}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def physical_cores() -> int:
    """Physical cores (hyper-threads counted once), from /proc/cpuinfo where there is one;
    the logical count elsewhere."""
    cores = set()
    try:
        phys = core = None
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "physical id":
                phys = value.strip()
            elif key == "core id":
                core = value.strip()
            elif not line.strip() and core is not None:
                cores.add((phys, core))
                phys = core = None
        if core is not None:
            cores.add((phys, core))
    except OSError:
        pass
    return len(cores) or max(1, os.cpu_count() or 1)


def load_per_core() -> float:
    """The 1-minute load average per logical core, or -1 where the OS has none."""
    try:
        return os.getloadavg()[0] / max(1, os.cpu_count() or 1)
    except (AttributeError, OSError):
        return -1.0


def median_seconds(fn, repeats: int) -> float:
    """Median wall-clock seconds of fn() over repeats, after one warm-up call."""
    fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def probe(*, k: int = 2048, n: int = 8192, rows: int = 128, repeats: int = 5) -> CpuChoice:
    """Measure now (about a second): one-row and ``rows``-row multiplies of an [n, k]
    weight (64 MB in float32, beyond the caches like a model's weights) in float32 and
    bfloat16, at 1 thread and at every core."""
    saved = torch.get_num_threads()
    cores = max(1, os.cpu_count() or 1)
    load = load_per_core()
    g = torch.Generator().manual_seed(0)
    w32 = torch.randn(n, k, generator=g)
    x32 = torch.randn(rows, k, generator=g)
    times: dict[tuple[str, str, int], float] = {}
    try:
        with torch.inference_mode():
            for dt, name in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16")):
                w, x = w32.to(dt), x32.to(dt)
                for t in sorted({1, cores}):
                    torch.set_num_threads(t)
                    linear = torch.nn.functional.linear
                    times[(name, "decode", t)] = median_seconds(lambda: linear(x[:1], w), repeats)
                    times[(name, "prefill", t)] = median_seconds(lambda: linear(x, w), max(2, repeats // 2))
    finally:
        torch.set_num_threads(saved)
    best = {phase: {name: min(times[(name, phase, t)] for t in {1, cores}) for name in ("float32", "bfloat16")}
            for phase in ("decode", "prefill")}
    dec = best["decode"]["float32"] / best["decode"]["bfloat16"]
    pre = best["prefill"]["float32"] / best["prefill"]["bfloat16"]
    # Decode is what a chat waits on token after token; take bfloat16 when it is faster
    # there and does not make prompts much slower (some CPUs emulate bf16 matmuls).
    dtype = "bfloat16" if dec >= 1.05 and pre >= 0.8 else "float32"
    pick = lambda phase: min({1, cores}, key=lambda t: times[(dtype, phase, t)])  # noqa: E731
    gain = lambda phase: times[(dtype, phase, 1)] / times[(dtype, phase, cores)]  # noqa: E731
    return CpuChoice(dtype, pick("prefill"), pick("decode"), round(dec, 3), round(pre, 3), fingerprint(),
                     time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), round(gain("prefill"), 3),
                     round(gain("decode"), 3), cores, PROBE_VERSION, round(load, 3))


@dataclass
class ThreadPlan:
    """Torch threads for prefill and for decode on this CPU, and why."""
    prefill: int
    decode: int
    reason: str


def thread_plan(budget: int, override: int | None = None, choice: CpuChoice | None = None) -> ThreadPlan:
    """Threads for each phase, at most ``budget`` (what the caller may use: the app leaves
    a core to its UI). ``override`` (a user's thread setting) wins. Otherwise the hardware
    rule, one thread per physical core for both phases (prefill's matmuls scale with cores;
    decode reads weights at the memory's pace, which one core rarely reaches), except where
    a quiet probe measured more threads clearly slower in that phase."""
    if override is not None:
        return ThreadPlan(override, override, f"{override} threads: set by the user")
    c = choice or cpu_choice()
    rule = max(1, min(physical_cores(), budget))
    if c.measured == "override" or not c.max_threads:
        return ThreadPlan(rule, rule, f"{rule} threads: one per physical core (not measured)")
    if not c.quiet:
        return ThreadPlan(rule, rule, f"{rule} threads: one per physical core (the probe of {c.measured} "
                                      f"ran under load {c.load:.2f} per core; measured again when quiet)")
    slower = {phase: gain * SLOWER < 1 and c.max_threads > 1 for phase, gain in
              (("prefill", c.prefill_thread_speedup), ("decode", c.decode_thread_speedup))}
    pre, dec = (1 if slower[p] else rule for p in ("prefill", "decode"))
    why = (f"one per physical core unless slower; probe ({c.measured}): {c.max_threads} threads vs 1 gave "
           f"prefill {c.prefill_thread_speedup:.2f}x, decode {c.decode_thread_speedup:.2f}x")
    if budget < physical_cores():
        why += f"; at most {budget} here"
    return ThreadPlan(pre, dec, f"prefill {pre} / decode {dec} threads: {why}")


def plan_for(device: torch.device, budget: int, override: int | None = None) -> ThreadPlan | None:
    """The thread plan for an engine on ``device`` (None off the CPU: threads do not apply)."""
    return thread_plan(budget, override) if torch.device(device).type == "cpu" else None


_CHOICE: CpuChoice | None = None


def cpu_choice(cache_dir: Path | None = None) -> CpuChoice:
    """This CPU's choice: from ``LLAMADESK_CPU_DTYPE``, the in-process memo, the cache file
    when its fingerprint matches, else a fresh :func:`probe` (then cached)."""
    global _CHOICE
    env = os.environ.get(DTYPE_ENV, "").strip()
    if env in ("float32", "bfloat16"):
        cores = max(1, os.cpu_count() or 1)
        return CpuChoice(env, cores, cores, 0.0, 0.0, fingerprint(), "override", max_threads=0,
                         version=PROBE_VERSION)
    if _CHOICE is not None and cache_dir is None:
        return _CHOICE
    path = (cache_dir or data_dir()) / CACHE_NAME
    fp = fingerprint()
    choice = None
    try:
        saved = json.loads(path.read_text())
        if saved.get("fingerprint") == fp and saved.get("version") == PROBE_VERSION:
            choice = CpuChoice(**saved)
            if not choice.quiet and 0 <= load_per_core() < QUIET_LOAD:
                choice = None  # measured while busy, and now there is a quiet moment
    except (OSError, ValueError, TypeError):
        pass
    if choice is None:
        choice = probe()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(asdict(choice), indent=2))
        except OSError:
            pass  # a read-only data folder: probe again next start
    if cache_dir is None:
        _CHOICE = choice
    return choice
