"""Checkpoint loading: load time and peak resident memory of a ~1 GB model in each format.

One random Llama of ~245M parameters (~0.98 GB in float32) is written once into a work
folder with the project's own writers: a Meta folder (float32, plus a bfloat16 copy made
by ``core.checkpoints.convert``), a Hugging Face folder (safetensors, float32) and two GGUF files
(F32, and F16 to show what dequantizing into float32 costs). Each is then loaded into
float32 on the CPU in a fresh subprocess, so every peak RSS belongs to one load, and so
is ``transformers.LlamaForCausalLM.from_pretrained`` on the same HF folder.

Per load: resident memory after the imports (the baseline), the load's wall time, the
peak RSS over the baseline (``getrusage`` ru_maxrss), and the same after every weight has
been read once ("touch": memory-mapped loaders defer page reads to first use, so their
load alone looks free). A sampler thread splits the peak into anonymous memory (copies
the loader made) and file-backed pages (the memory map of the checkpoint). Ratios are
against the weights' size in the compute dtype (float32) and against the file's size.
The goal (issue 3): peak RSS during load <= 1.3x the weights in the compute dtype.

The files are read from the page cache (they were just written, or were read by an
earlier run): the timings measure the loaders, not the disk.

    python bench/bench_load.py [--work DIR] [--threads N] [--repeats 2] [--cleanup]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FIXTURES = Path(os.environ.get("LLAMADESK_FIXTURES", ROOT.parent / "shared" / "fixtures"))
SP_MODEL = FIXTURES / "llama2-tokenizer.model"

# ~245M parameters: 2 x 32.8M embedding/output + 16 x 11.2M per layer -> 0.98 GB float32.
ARGS = dict(dim=1024, n_layers=16, n_heads=16, n_kv_heads=4, hidden_dim=2816, vocab_size=32000,
            max_seq_len=2048, norm_eps=1e-5, rope_theta=10000.0)

# (label, path inside the work folder, how it is loaded)
CASES = [
    ("Meta float32", "meta-f32", "ours"),
    ("Meta bfloat16", "meta-bf16", "ours"),
    ("HF safetensors f32", "hf-f32", "ours"),
    ("GGUF F32", "model-f32.gguf", "ours"),
    ("GGUF F16", "model-f16.gguf", "ours"),
    ("transformers (HF f32)", "hf-f32", "transformers"),
]
MB = 1e6


# --------------------------------------------------------------------------- writing

def sp_gguf_vocab(sp_file: Path):
    """tokens, scores and llama.cpp token types of a SentencePiece model."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(sp_file))
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        # llama.cpp: 1 normal, 2 unknown, 3 control, 5 unused, 6 byte
        types.append(3 if sp.is_control(i) else 2 if sp.is_unknown(i) else 6 if sp.is_byte(i)
                     else 5 if sp.is_unused(i) else 1)
    ids = dict(unk=sp.unk_id(), bos=sp.bos_id(), eos=sp.eos_id())
    return tokens, scores, types, ids


def write_gguf(model, dst: Path, kind: str, sp_file: Path) -> None:
    """A llama GGUF from our model (Meta layout is GGUF's layout); 2-D weights as ``kind``
    ('F32' or 'F16'), norms F32 as llama.cpp stores them; the llama2 vocabulary embedded."""
    import gguf
    import numpy as np

    from core.checkpoints.gguf import gguf_name
    from core.checkpoints.gguf_write import add_llama_params

    w = gguf.GGUFWriter(str(dst), "llama")
    add_llama_params(w, model.args, "bench-load random llama", kind)
    tokens, scores, types, ids = sp_gguf_vocab(sp_file)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(ids["unk"])
    w.add_bos_token_id(ids["bos"])
    w.add_eos_token_id(ids["eos"])
    w.add_add_space_prefix(True)
    for name, t in model.state_dict().items():
        x = t.detach().numpy()  # a view: F32 tensors are written without a copy
        if kind == "F16" and x.ndim == 2:
            x = x.astype(np.float16)
        w.add_tensor(gguf_name(name), x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def build_work(work: Path) -> None:
    """Write every checkpoint the cases need that is not already in ``work``."""
    import torch

    from core.prompt.chat_format import chat_format_for
    from core.checkpoints.common import LoadedModel
    from core.checkpoints.hf import save_hf
    from core.checkpoints.meta import save_meta
    from core.checkpoints.convert import convert
    from core.model.transformer import Transformer
    from core.model.args import ModelArgs
    from core.tokenizer import load_tokenizer

    stamp = work / "bench-config.json"
    want = json.dumps(ARGS, sort_keys=True)
    if stamp.is_file() and stamp.read_text() != want:
        raise SystemExit(f"{work} holds checkpoints of another configuration; remove it or pass another --work")
    work.mkdir(parents=True, exist_ok=True)
    stamp.write_text(want)
    todo = [p for p in ("meta-f32", "hf-f32", "model-f32.gguf", "model-f16.gguf", "meta-bf16")
            if not (work / p).exists()]
    if not todo:
        print(f"reusing the checkpoints in {work}")
        return
    if not SP_MODEL.is_file():
        raise SystemExit(f"the llama2 tokenizer fixture is missing: {SP_MODEL}")
    t0 = time.perf_counter()
    torch.manual_seed(0)
    model = Transformer(ModelArgs(**ARGS)).eval().requires_grad_(False)  # random weights
    tok = load_tokenizer(SP_MODEL)
    loaded = LoadedModel(model, tok, chat_format_for(tok), model.args, set(tok.stop_ids))

    def aside(name: str, write) -> None:
        """Write beside the final name and move into place, so a stopped run leaves no
        half-written checkpoint that a later run would reuse."""
        final, part = work / name, work / (name + ".partial")
        if part.is_dir():
            shutil.rmtree(part)
        else:
            part.unlink(missing_ok=True)
        write(part)
        part.rename(final)
        print(f"  wrote {name} ({size_of(final) / MB:.0f} MB)", flush=True)

    print(f"writing checkpoints into {work}", flush=True)
    if "meta-f32" in todo:
        aside("meta-f32", lambda d: save_meta(loaded, d, tokenizer_file=SP_MODEL))
    if "hf-f32" in todo:
        aside("hf-f32", lambda d: save_hf(loaded, d, dtype=torch.float32))
    for kind in ("F32", "F16"):
        name = f"model-{kind.lower()}.gguf"
        if name in todo:
            aside(name, lambda d, kind=kind: write_gguf(model, d, kind, SP_MODEL))
    del loaded, model
    gc.collect()
    if "meta-bf16" in todo:  # through the converter: load the float32 folder, write bfloat16
        aside("meta-bf16", lambda d: convert(work / "meta-f32", d, fmt="meta", dtype="bfloat16"))
    print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)


def size_of(p: Path) -> int:
    """Bytes of the weights: the file, or a folder's weight files."""
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.iterdir() if f.suffix in (".pth", ".safetensors", ".gguf", ".bin"))


# --------------------------------------------------------------------------- measuring (child)

def _status_kb() -> dict[str, int]:
    """VmRSS / RssAnon / RssFile of this process in kB (Linux), else psutil's RSS."""
    try:
        out = {}
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:", "RssAnon:", "RssFile:")):
                    k, v = line.split(":", 1)
                    out[k] = int(v.split()[0])
        return out
    except OSError:
        import psutil
        return {"VmRSS": psutil.Process().memory_info().rss // 1024}


class Sampler(threading.Thread):
    """Polls resident memory every ``interval`` s, keeping the peak of each kind."""

    def __init__(self, interval: float = 0.002):
        super().__init__(daemon=True)
        self.interval = interval
        self.peak: dict[str, int] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            for k, v in _status_kb().items():
                if k != "VmHWM" and v > self.peak.get(k, 0):
                    self.peak[k] = v
            time.sleep(self.interval)

    def take(self) -> dict[str, int]:
        """The peaks so far (bytes), then start over."""
        for k, v in _status_kb().items():
            if k != "VmHWM":
                self.peak[k] = max(self.peak.get(k, 0), v)
        out = {k: v * 1024 for k, v in self.peak.items()}
        self.peak = {}
        return out

    def stop(self) -> None:
        self._halt.set()
        self.join()


def maxrss() -> int:
    """ru_maxrss in bytes: the process's peak RSS so far (its whole life)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024  # Linux reports kB


def reset_peak() -> bool:
    """Restart the kernel's peak-RSS mark (VmHWM) at the current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def hwm() -> int | None:
    kb = _status_kb().get("VmHWM")
    return None if kb is None else kb * 1024


def child(how: str, path: str, threads: int) -> None:
    """Load ``path`` once in this (fresh) process and print one JSON line of measurements."""
    import psutil
    import torch

    torch.set_num_threads(threads)
    proc = psutil.Process()
    # Everything the loaders import, imported before the baseline: the load pays for data only.
    import gguf  # noqa: F401
    import safetensors.torch  # noqa: F401
    import sentencepiece  # noqa: F401

    import core.checkpoints.gguf  # noqa: F401
    import core.checkpoints.hf  # noqa: F401
    import core.checkpoints.meta  # noqa: F401
    from core.checkpoints import load
    if how == "transformers":
        from transformers import LlamaForCausalLM
    gc.collect()
    base = proc.memory_info().rss
    base_status = {k: v * 1024 for k, v in _status_kb().items()}
    exact = reset_peak()  # else the peak below also holds import-time transients
    sampler = Sampler()
    sampler.start()
    t0 = time.perf_counter()
    if how == "transformers":
        model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    else:
        model = load(path, device="cpu", dtype="float32").model
    load_s = time.perf_counter() - t0
    maxrss_load = maxrss()
    peak_load = hwm() if exact else maxrss_load
    split_load = sampler.take()
    after_load = proc.memory_info().rss
    params = list(model.parameters())
    weights = sum(p.numel() * p.element_size() for p in params)
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in params})
    # Read every weight once: memory-mapped tensors only become resident here.
    t0 = time.perf_counter()
    with torch.inference_mode():
        for p in params:
            p.sum()
    touch_s = time.perf_counter() - t0
    peak_touch = max(peak_load, hwm() if exact else maxrss())
    split_touch = sampler.take()
    after_touch = proc.memory_info().rss
    sampler.stop()

    def over(split, key):
        return split.get(key, 0) - base_status.get(key, 0)

    import transformers
    print(json.dumps(dict(
        load_s=load_s, touch_s=touch_s, base=base, peak_load=peak_load, maxrss_load=maxrss_load,
        exact=exact, after_load=after_load, peak_touch=peak_touch, after_touch=after_touch,
        weights=weights, dtypes=dtypes,
        anon_load=over(split_load, "RssAnon"), file_load=over(split_load, "RssFile"),
        anon_touch=over(split_touch, "RssAnon"), file_touch=over(split_touch, "RssFile"),
        versions=f"torch {torch.__version__}, transformers {transformers.__version__}",
    )))


# --------------------------------------------------------------------------- driver

def run_child(how: str, path: Path, threads: int) -> dict | None:
    """This script in a fresh process (so its peak RSS is its own); its JSON line, if any."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", how, str(path), "--threads", str(threads)]
    env = dict(os.environ, TRANSFORMERS_VERBOSITY="error", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    if how == "build":  # its progress lines go straight to the terminal
        r = subprocess.run(cmd, env=env, cwd=str(ROOT))
        if r.returncode != 0:
            raise SystemExit(f"writing the checkpoints into {path} failed")
        return None
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(ROOT))
    if r.returncode != 0:
        raise SystemExit(f"load of {path} ({how}) failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "llamadesk-bench-load",
                    help="folder for the checkpoints (reused when present; default %(default)s)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeats", type=int, default=2,
                    help="loads per format, each in its own process (best time, highest peak)")
    ap.add_argument("--cleanup", action="store_true", help="delete the work folder at the end")
    ap.add_argument("--child", nargs=2, metavar=("HOW", "PATH"), help=argparse.SUPPRESS)
    return ap.parse_args()


def measure_all(a: argparse.Namespace) -> list:
    """Every case, ``a.repeats`` times, each load in its own child: (label, merged result)."""
    # This process imports no torch and builds nothing: on Linux a child's ru_maxrss starts
    # at its parent's peak RSS (exec folds the old image's high-water mark into it).
    work = a.work.expanduser().resolve()
    try:
        run_child("build", work, a.threads)
        results = []
        for label, rel, how in CASES:
            runs = [run_child(how, work / rel, a.threads) for _ in range(a.repeats)]
            r = min(runs, key=lambda x: x["load_s"])
            for k in ("peak_load", "maxrss_load", "peak_touch", "anon_load", "file_load", "anon_touch",
                      "file_touch", "after_touch"):
                r[k] = max(x[k] for x in runs)
            r["file"] = size_of(work / rel)
            results.append((label, r))
            print(f"  loaded {label} in {r['load_s']:.2f} s", flush=True)
    finally:
        if a.cleanup:
            shutil.rmtree(work, ignore_errors=True)
    return results


def print_report(results: list, threads: int) -> None:
    tf_s = next(r["load_s"] for label, r in results if label.startswith("transformers"))
    w32 = results[0][1]["weights"]
    exact = all(r["exact"] for _, r in results)
    print(f"\nmodel: {w32 / 4 / 1e6:.0f}M params, {w32 / MB:.0f} MB in float32 (the compute dtype); "
          f"{threads} threads, {results[0][1]['versions']}")
    print("peak: highest RSS during the load minus the RSS after the imports ("
          + ("VmHWM, reset just before the load" if exact else "ru_maxrss") + "); x wts: over the float32 "
          "weights; +touch: through reading every weight once after the load")
    hdr = (f"{'format':22}{'file MB':>8}{'load s':>8}{'peak MB':>9}{'x wts':>7}{'x file':>7}"
           f"{'touch s':>8}{'+touch MB':>10}{'x wts':>7}{'load vs tf':>11}")
    print(hdr)
    print("-" * len(hdr))
    for label, r in results:
        pl, pt = r["peak_load"] - r["base"], r["peak_touch"] - r["base"]
        print(f"{label:22}{r['file'] / MB:8.0f}{r['load_s']:8.2f}{pl / MB:9.0f}{pl / r['weights']:7.2f}"
              f"{pl / r['file']:7.2f}{r['touch_s']:8.2f}{pt / MB:10.0f}{pt / r['weights']:7.2f}"
              f"{r['load_s'] / tf_s:10.2f}x")
    print("\nwhere the memory is, over the baseline (MB; sampled every 2 ms): anon = copies the loader made, "
          "file = mapped checkpoint pages; held = RSS after load + touch; ru_maxrss = getrusage's peak")
    print(f"{'format':22}{'anon load':>10}{'file load':>10}{'anon +touch':>12}{'file +touch':>12}"
          f"{'held':>7}{'ru_maxrss':>10}  dtypes")
    for label, r in results:
        print(f"{label:22}{r['anon_load'] / MB:10.0f}{r['file_load'] / MB:10.0f}{r['anon_touch'] / MB:12.0f}"
              f"{r['file_touch'] / MB:12.0f}{(r['after_touch'] - r['base']) / MB:7.0f}"
              f"{(r['maxrss_load'] - r['base']) / MB:10.0f}  {','.join(r['dtypes'])}")
    over = [label for label, r in results if (r["peak_load"] - r["base"]) / r["weights"] > 1.3]
    over_t = [label for label, r in results if (r["peak_touch"] - r["base"]) / r["weights"] > 1.3]
    print("\ngoal, peak RSS <= 1.3x the float32 weights: during the load "
          f"{'met by all' if not over else 'exceeded by ' + ', '.join(over)}; through the first touch "
          f"{'met by all' if not over_t else 'exceeded by ' + ', '.join(over_t)}")


def main() -> None:
    a = parse_args()
    if a.child:
        if a.child[0] == "build":
            build_work(Path(a.child[1]))
        else:
            child(a.child[0], a.child[1], a.threads)
        return
    print_report(measure_all(a), a.threads)


if __name__ == "__main__":
    main()
