"""Train LlamaDesk's bundled demo model from nothing but the project's own code.

Stages (each resumable, each reading the previous stage's files from the work folder):

  corpus     sample short stories from the real story model in the fixtures
             (stories260K.gguf, Karpathy's llama2.c tinyllamas, MIT) with our Engine,
             from varied openings, and turn each into a chat pair (user request ->
             story); topics are split so held-out topics never appear in training
  tokenizer  train a SentencePiece BPE model on the corpus, with byte fallback and the
             Llama 3 chat markers as control symbols
  train      train a small Llama (core.model.transformer.Transformer) on the chat pairs, loss on the
             assistant's tokens only; AdamW, warmup + cosine LR, periodic validation,
             checkpoints that `--resume` picks up
  export     write a Meta folder (params.json, consolidated.00.pth, tokenizer.model)
  eval       measure the quality bar on held-out prompts; writes eval.json
  all        corpus, tokenizer, train, export, eval

Examples:
  python tools/train_demo.py all                      # the real thing (about an hour)
  python tools/train_demo.py train --resume           # continue after an interruption
  python tools/train_demo.py all --tiny --work /tmp/t --out /tmp/t/model   # seconds
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from tools.demo_data import (  # noqa: E402
    batches_for_epoch, clean_story, draw_topic, encode_split, is_heldout, keep_story, make_batch, topic_key,
    topic_words,
)

DEFAULT_WORK = ROOT / "tools" / "work" / "demo"
DEFAULT_OUT = ROOT / "assets" / "models" / "llamadesk-demo"
CHAT_MARKERS = ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")


STORY_MODEL = ROOT / "tests" / "fixtures" / "stories260K.gguf"  # MIT, shipped with the tests


# --------------------------------------------------------------------------- configuration


@dataclass
class Config:
    seed: int = 1234
    # corpus
    stories: int = 2000  # kept stories wanted (train + held out); about a third of samples are kept
    corpus_minutes: float = 40.0  # stop sampling after this long even if short of `stories`
    gen_batch: int = 160  # stories decoded side by side
    gen_max_tokens: int = 320  # stories260K tokens; longer ones are dropped, not cut
    gen_temperature: tuple[float, float] = (0.8, 1.0)
    gen_top_p: float = 0.95
    heldout_percent: float = 5.0
    keep_min_chars: int = 200  # continuation length a kept story needs
    keep_unfinished: bool = False  # keep stories cut by gen_max_tokens (tiny runs only)
    # tokenizer
    vocab_size: int = 2048
    # model
    # Chosen by a side-by-side 2.5-minute run on the real corpus: dim 192 x 5 layers (2.4M
    # params) reached held-out loss 4.19 at ~900 tok/s, dim 128 x 4 layers (1.0M) 3.75 at
    # ~1700 tok/s; with ~340k training tokens the smaller model also overfits less.
    dim: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2  # GQA, as in the Llama 3 models the app runs
    multiple_of: int = 32
    max_seq_len: int = 512
    dropout: float = 0.2  # ~26 passes over a small corpus; at 0.1 held-out loss stalled by step 1,000
    # training
    batch_size: int = 16
    seq_len: int = 384  # chat sequences are cut to this many tokens
    lr: float = 2e-3
    min_lr: float = 1e-4
    warmup: int = 100
    max_steps: int = 100000  # in practice time binds first
    train_minutes: float = 38.0  # the cosine schedule follows steps or time, whichever is ahead
    weight_decay: float = 0.1
    eval_every: int = 200
    eval_batches: int = 8
    ckpt_every: int = 100
    export_best: bool = False  # export best.pt (lowest periodic val loss) instead of the last step
    threads: int = 1  # measured on a shared 2-core box: 1 thread ~4x faster than 2 (see main)
    # eval
    eval_prompts: int = 1000  # one per held-out topic, all of them (a corpus has ~50-60)
    eval_max_tokens: int = 400

    @classmethod
    def tiny(cls) -> "Config":
        """Seconds, not hours: proves every stage runs; the model it makes is noise."""
        return cls(stories=16, corpus_minutes=1.0, gen_batch=16, gen_max_tokens=40, heldout_percent=25.0,
                   keep_min_chars=0, keep_unfinished=True, threads=1,
                   vocab_size=400, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, multiple_of=16,
                   max_seq_len=256, dropout=0.0, batch_size=4, seq_len=255, warmup=2, max_steps=6,
                   train_minutes=1.0, eval_every=3, eval_batches=1, ckpt_every=3, eval_prompts=2,
                   eval_max_tokens=16)


# --------------------------------------------------------------------------- corpus


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:  # a line cut by an interruption
                    pass
    return out


def stage_corpus(cfg: Config, work: Path, log=print) -> Path:
    """Append chat pairs to work/corpus.jsonl until `stories` are kept or time runs out."""
    from core.checkpoints import load
    from core.engine.engine import Engine
    from core.engine.events import Done
    from core.engine.settings import SamplingParams

    work.mkdir(parents=True, exist_ok=True)
    out = work / "corpus.jsonl"
    have = read_jsonl(out)
    if len(have) >= cfg.stories:
        log(f"corpus: {len(have)} stories already in {out}")
        return out
    src = STORY_MODEL
    lm = load(src, device="cpu", dtype="float32")
    tok = lm.tokenizer
    # llama2.c's story models end a story by starting the next one with BOS; EOS never comes.
    stops = {i for i in (tok.bos_id, tok.eos_id) if i is not None}
    engine = Engine(lm.model, tok, stop_ids=sorted(stops))
    t0 = time.perf_counter()
    kept, tried, rnd = len(have), 0, 0
    with open(out, "a") as f:
        while kept < cfg.stories and time.perf_counter() - t0 < cfg.corpus_minutes * 60:
            # Seeded by what the file already holds, so a resumed run draws new topics.
            rng = random.Random(f"{cfg.seed}:{len(have)}:{rnd}")
            rnd += 1
            topics = [draw_topic(rng) for _ in range(cfg.gen_batch)]
            prompts = [tok.encode(t["opening"], bos=True) for t in topics]
            lo, hi = cfg.gen_temperature
            params = SamplingParams(temperature=round(rng.uniform(lo, hi), 2), top_p=cfg.gen_top_p,
                                    max_new_tokens=cfg.gen_max_tokens, seed=rng.randrange(2**31))
            for ev in engine.generate_batch(prompts, params):
                if not isinstance(ev, Done):
                    continue
                tried += 1
                t = topics[ev.lane]
                cont = clean_story(ev.text)
                if not keep_story(cfg, t["slots"], cont, ev.stop_reason):
                    continue
                key = topic_key(t["slots"])
                rec = {"topic": key, "heldout": is_heldout(key, cfg.heldout_percent), "slots": t["slots"],
                       "request": t["request"], "story": f"{t['opening']} {cont}",
                       "temperature": params.temperature}
                f.write(json.dumps(rec) + "\n")
                kept += 1
            f.flush()
            el = time.perf_counter() - t0
            log(f"corpus: kept {kept}/{cfg.stories} (this run tried {tried}, "
                f"{100 * (kept - len(have)) / max(tried, 1):.0f}% kept) {el / 60:.1f} min")
    return out


# --------------------------------------------------------------------------- tokenizer


def split_corpus(work: Path) -> tuple[list[dict], list[dict]]:
    recs = read_jsonl(work / "corpus.jsonl")
    if not recs:
        raise SystemExit(f"no corpus in {work}; run the corpus stage first")
    return [r for r in recs if not r["heldout"]], [r for r in recs if r["heldout"]]


def stage_tokenizer(cfg: Config, work: Path, log=print) -> Path:
    """SentencePiece BPE on the training split (held-out text stays unseen)."""
    import sentencepiece as spm

    train, _ = split_corpus(work)
    text = work / "tokenizer_input.txt"
    with open(text, "w") as f:
        for r in train:
            # SentencePiece learns from lines; newlines inside a story become byte tokens.
            for part in (r["request"], *r["story"].split("\n"), "user", "assistant"):
                if part.strip():
                    f.write(part.strip() + "\n")
    prefix = work / "tokenizer"
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(prefix), model_type="bpe", vocab_size=cfg.vocab_size,
        character_coverage=1.0, byte_fallback=True, split_digits=True,
        # Llama 2's conventions: exact text in, exact text out; a leading space marks a word.
        normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        # Control symbols, not user-defined ones: the encoder never produces them from text,
        # so a user typing "<|eot_id|>" cannot end a turn. The chat format inserts their ids.
        control_symbols=list(CHAT_MARKERS),
        num_threads=cfg.threads, seed_sentencepiece_size=200000, input_sentence_size=2000000,
        shuffle_input_sentence=True, max_sentence_length=8192, minloglevel=2,
    )
    log(f"tokenizer: {prefix}.model ({cfg.vocab_size} pieces)")
    return prefix.with_suffix(".model")


def load_chat_tokenizer(work: Path):
    from core.prompt.chat_format import chat_format_for
    from core.tokenizer import SentencePieceTokenizer

    tok = SentencePieceTokenizer(work / "tokenizer.model")
    fmt = chat_format_for(tok)
    if fmt.name != "llama3":
        raise SystemExit("the trained tokenizer lacks the Llama 3 chat markers")
    return tok, fmt


# --------------------------------------------------------------------------- training


def model_args(cfg: Config, vocab: int):
    from core.model.args import ModelArgs

    return ModelArgs(dim=cfg.dim, n_layers=cfg.n_layers, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads,
                     vocab_size=vocab, multiple_of=cfg.multiple_of, max_seq_len=cfg.max_seq_len,
                     tie_word_embeddings=True, dropout=cfg.dropout, norm_eps=1e-5, rope_theta=10000.0)


@torch.no_grad()
def evaluate(model, data, batch_size: int, max_batches: int | None) -> float:
    """Mean loss per reply token over the first batches of `data` (fixed order: comparable)."""
    was = model.training
    model.eval()
    order = sorted(range(len(data)), key=lambda i: len(data[i][0]))
    tot, cnt = 0.0, 0
    groups = [order[b:b + batch_size] for b in range(0, len(order), batch_size)]
    if max_batches:
        step = max(1, len(groups) // max_batches)  # spread over short and long stories
        groups = groups[::step][:max_batches]
    for g in groups:
        x, y, _ = make_batch([data[i] for i in g])
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1),
                                                 ignore_index=-100, reduction="sum")
        tot += float(loss)
        cnt += int((y != -100).sum())
    model.train(was)
    return tot / max(cnt, 1)


def lr_at(cfg: Config, step: int, progress: float) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    p = min(max(progress, 0.0), 1.0)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * p))


def save_atomic(obj, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)  # an interruption mid-save never leaves a broken checkpoint


def init_model(cfg: Config, args):
    """A fresh model and its AdamW (weight decay on matrices only)."""
    from core.model.transformer import Transformer

    model = Transformer(args)
    # Small init for the residual projections keeps early steps stable in a deep-ish stack.
    for name, p in model.named_parameters():
        if p.dim() == 2:
            std = 0.02 / math.sqrt(2 * cfg.n_layers) if name.endswith(("wo.weight", "w2.weight")) else 0.02
            torch.nn.init.normal_(p, 0.0, std)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    return model, opt


@dataclass
class TrainRun:
    """The training loop's state, shared by its helpers; step, elapsed and history survive a resume."""
    cfg: Config
    work: Path
    model: object
    opt: object
    args: object
    step: int = 0
    elapsed: float = 0.0
    history: list = field(default_factory=list)
    loss_ema: float | None = None
    t_last: float = 0.0
    tok_window: int = 0
    t_window: float = 0.0

    def progress(self) -> float:
        return max(self.step / self.cfg.max_steps, self.elapsed / (self.cfg.train_minutes * 60))

    def resume(self, ckpt: Path, log) -> None:
        st = torch.load(ckpt, map_location="cpu", weights_only=True, mmap=True)
        self.model.load_state_dict(st["model"])
        self.opt.load_state_dict(st["optim"])
        self.step, self.elapsed, self.history = st["step"], st["elapsed"], st["history"]
        log(f"train: resumed at step {self.step} ({self.elapsed / 60:.1f} min done)")

    def checkpoint(self, final: bool = False) -> None:
        save_atomic({"model": self.model.state_dict(), "optim": self.opt.state_dict(), "step": self.step,
                     "elapsed": self.elapsed, "history": self.history, "config": dataclasses.asdict(self.cfg),
                     "args": self.args.to_params(), "final": final}, self.work / "ckpt.pt")


def periodic_eval(run: TrainRun, held, rate: float) -> None:
    vl = evaluate(run.model, held, run.cfg.batch_size, run.cfg.eval_batches)
    run.history.append({"step": run.step, "train_loss": run.loss_ema, "val_loss": vl,
                        "minutes": run.elapsed / 60, "tok_s": rate})
    sys.stdout.write(f"\n  val loss {vl:.3f} at step {run.step}\n")
    if vl <= min(h["val_loss"] for h in run.history):
        # Kept in case a long run starts to overfit the small corpus.
        save_atomic({"model": run.model.state_dict(), "step": run.step, "val_loss": vl,
                     "args": run.args.to_params()}, run.work / "best.pt")
    run.t_last = time.perf_counter()  # evaluation time is not training time


def train_step(run: TrainRun, train, held, batch: list[int], epoch: int) -> None:
    """One optimiser step, the progress line, and the evaluation or checkpoint it is due."""
    cfg = run.cfg
    lr = lr_at(cfg, run.step, run.progress())
    for g in run.opt.param_groups:
        g["lr"] = lr
    x, y, n = make_batch([train[i] for i in batch])
    loss = run.model.loss(x, y)
    run.opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(run.model.parameters(), 1.0)
    run.opt.step()
    run.step += 1
    now = time.perf_counter()
    run.elapsed += now - run.t_last
    run.t_last = now
    run.tok_window += n
    lv = loss.item()
    run.loss_ema = lv if run.loss_ema is None else 0.95 * run.loss_ema + 0.05 * lv
    rate = run.tok_window / max(now - run.t_window, 1e-9)
    if now - run.t_window > 30:
        run.tok_window, run.t_window = 0, now
    pct = 100 * min(run.progress(), 1.0)
    bar = "#" * int(pct / 4)
    sys.stdout.write(f"\r[{bar:<25}] {pct:5.1f}% step {run.step} ep {epoch} loss {run.loss_ema:.3f} "
                     f"lr {lr:.2e} {rate:,.0f} tok/s {run.elapsed / 60:.1f} min")
    sys.stdout.flush()
    if run.step % cfg.eval_every == 0:
        periodic_eval(run, held, rate)
    if run.step % cfg.ckpt_every == 0:
        run.checkpoint()
        run.t_last = time.perf_counter()


def train_loop(run: TrainRun, train, held) -> None:
    cfg = run.cfg
    run.model.train()
    run.t_last, run.tok_window, run.t_window = time.perf_counter(), 0, time.perf_counter()
    per_epoch = len(batches_for_epoch(train, cfg.batch_size, random.Random(0)))
    while run.progress() < 1.0:
        # The epoch's batch order is a function of (seed, epoch), so a resumed run carries on
        # exactly where the checkpoint left off.
        epoch = run.step // per_epoch
        order = batches_for_epoch(train, cfg.batch_size, random.Random(f"{cfg.seed}:{epoch}"))
        for b in order[run.step % per_epoch:]:
            if run.progress() >= 1.0:
                break
            train_step(run, train, held, b, epoch)


def stage_train(cfg: Config, work: Path, resume: bool = True, log=print) -> Path:
    """Train until max_steps or train_minutes, whichever comes first.

    The cosine schedule follows whichever of the two is further along, so a slow (or busy)
    machine still finishes with a fully decayed learning rate instead of being cut off
    at a high one.
    """
    tok, fmt = load_chat_tokenizer(work)
    train_recs, held_recs = split_corpus(work)
    train = encode_split(train_recs, fmt, tok, cfg.seq_len)
    held = encode_split(held_recs, fmt, tok, cfg.seq_len)
    if not train or not held:
        raise SystemExit("need both a training and a held-out split")
    torch.manual_seed(cfg.seed)
    args = model_args(cfg, tok.vocab_size)
    model, opt = init_model(cfg, args)
    run = TrainRun(cfg, work, model, opt, args)
    ckpt = work / "ckpt.pt"
    if resume and ckpt.exists():
        run.resume(ckpt, log)
    n_tok = sum(len(i) for i, _ in train)
    log(f"train: {model.num_parameters():,} params, {len(train)} train / {len(held)} held-out dialogs "
        f"({n_tok:,} train tokens), vocab {tok.vocab_size}")
    train_loop(run, train, held)
    sys.stdout.write("\n")
    vl = evaluate(model, held, cfg.batch_size, None)
    run.history.append({"step": run.step, "train_loss": run.loss_ema, "val_loss": vl,
                        "minutes": run.elapsed / 60, "final": True})
    log(f"train: done at step {run.step}, {run.elapsed / 60:.1f} min, held-out loss {vl:.3f} "
        f"(perplexity {math.exp(vl):.2f})")
    run.checkpoint(final=True)
    return ckpt


# --------------------------------------------------------------------------- export


def stage_export(cfg: Config, work: Path, out: Path, log=print) -> Path:
    """The trained weights as a Meta folder that core.checkpoints.load opens."""
    from core.checkpoints.common import LoadedModel
    from core.checkpoints.meta import save_meta
    from core.model.transformer import Transformer
    from core.model.args import ModelArgs

    tok, fmt = load_chat_tokenizer(work)
    st = torch.load(work / "ckpt.pt", map_location="cpu", weights_only=True, mmap=True)
    history = st["history"]
    if cfg.export_best:
        st = torch.load(work / "best.pt", map_location="cpu", weights_only=True, mmap=True)
        log(f"export: best checkpoint, step {st['step']}, val loss {st['val_loss']:.3f}")
    args = ModelArgs.from_params(st["args"], dropout=0.0)
    model = Transformer(args)
    model.load_state_dict(st["model"])
    model.eval()
    lm = LoadedModel(model, tok, fmt, args, set(tok.stop_ids) | fmt.stop_ids())
    save_meta(lm, out, tokenizer_file=work / "tokenizer.model")
    (work / "history.json").write_text(json.dumps(history, indent=1))
    size = sum(f.stat().st_size for f in out.iterdir() if f.name != "README.md")
    log(f"export: {out} ({size / 1e6:.1f} MB, {model.num_parameters():,} params)")
    return out


# --------------------------------------------------------------------------- evaluation

WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")


def word_list(recs: list[dict], min_count: int = 3) -> set[str]:
    """The dictionary for the English check.

    There is no system dictionary to rely on, so the list is every word written at least
    `min_count` times in the training stories (which the real story model wrote): a made-up
    word the small model invents once in a while does not make it in.
    """
    counts: dict[str, int] = {}
    for r in recs:
        for w in WORD.findall(r["story"]):
            w = w.lower()
            counts[w] = counts.get(w, 0) + 1
    return {w for w, c in counts.items() if c >= min_count}


def english_share(text: str, words: set[str]) -> float:
    found = [w.lower() for w in WORD.findall(text)]
    if not found:
        return 0.0
    return sum(w in words or w.removesuffix("'s") in words for w in found) / len(found)


def on_topic(text: str, slots: dict) -> bool:
    low = text.lower()
    return any(re.search(rf"\b{re.escape(w.lower())}\b", low) for w in topic_words(slots))


def stage_eval(cfg: Config, work: Path, out: Path, log=print) -> dict:
    """The quality bar, measured on held-out topics through the app's own loader and engine."""
    from core.checkpoints import load
    from core.engine.engine import Engine
    from core.engine.events import Done
    from core.engine.settings import SamplingParams

    lm = load(out, device="cpu", dtype="float32")
    tok, fmt = lm.tokenizer, lm.chat_format
    train_recs, held_recs = split_corpus(work)
    held = encode_split(held_recs, fmt, tok, cfg.seq_len)
    val = evaluate(lm.model, held, cfg.batch_size, None)
    words = word_list(train_recs)
    train_topics = {r["topic"] for r in train_recs}
    seen, prompts = set(), []
    for r in held_recs:  # one prompt per held-out topic, none of them seen in training
        if r["topic"] not in seen and r["topic"] not in train_topics:
            seen.add(r["topic"])
            prompts.append(r)
    prompts = prompts[:cfg.eval_prompts]
    engine = Engine(lm.model, tok, stop_ids=sorted(lm.stop_ids))
    rows = []
    t0 = time.perf_counter()
    ids = [fmt.encode_dialog([{"role": "user", "content": r["request"]}]) for r in prompts]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=cfg.eval_max_tokens, seed=0)
    done = {ev.lane: ev for ev in engine.generate_batch(ids, greedy) if isinstance(ev, Done)}
    for i, r in enumerate(prompts):
        d = done[i]
        text = d.text.strip()
        rows.append({"request": r["request"], "reply": text, "chars": len(text), "stop_reason": d.stop_reason,
                     "english": round(english_share(text, words), 4), "on_topic": on_topic(text, r["slots"]),
                     "tokens": len(d.tokens)})
    gen_s = time.perf_counter() - t0
    n = max(len(rows), 1)
    summary = {
        "heldout_loss": round(val, 4), "heldout_perplexity": round(math.exp(val), 3),
        "heldout_dialogs": len(held), "prompts": len(rows), "dictionary_words": len(words),
        "replies_200_chars": sum(r["chars"] >= 200 for r in rows) / n,
        "replies_eos": sum(r["stop_reason"] == "eos" for r in rows) / n,
        "replies_on_topic": sum(r["on_topic"] for r in rows) / n,
        "replies_english_90": sum(r["english"] >= 0.9 for r in rows) / n,
        "mean_english": sum(r["english"] for r in rows) / n,
        "mean_chars": sum(r["chars"] for r in rows) / n,
        "all_pass": sum(r["chars"] >= 200 and r["stop_reason"] == "eos" and r["on_topic"] and r["english"] >= 0.9
                        for r in rows) / n,
        "greedy_tok_s": sum(r["tokens"] for r in rows) / max(gen_s, 1e-9),
    }
    # Temperature and top-p must visibly change the reply: one prompt, one seed, three settings.
    demo = [fmt.encode_dialog([{"role": "user", "content": "Tell me a story about a cat named Lily."}])]
    variants = []
    for temp, top_p in ((0.0, 1.0), (0.7, 0.9), (1.2, 1.0)):
        sp = SamplingParams(temperature=temp, top_p=top_p, seed=7, max_new_tokens=cfg.eval_max_tokens)
        d = [ev for ev in engine.generate_batch(demo, sp) if isinstance(ev, Done)][0]
        variants.append({"temperature": temp, "top_p": top_p, "seed": 7, "reply": d.text.strip(),
                         "stop_reason": d.stop_reason})
    result = {"summary": summary, "replies": rows, "sampling_variants": variants}
    (work / "eval.json").write_text(json.dumps(result, indent=1))
    (out / "eval.json").write_text(json.dumps(result, indent=1))  # the numbers travel with the model
    log("eval: " + json.dumps(summary))
    return result


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("stage", choices=["corpus", "tokenizer", "train", "export", "eval", "all"])
    ap.add_argument("--work", type=Path, default=DEFAULT_WORK, help="intermediate files (corpus, checkpoints)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the Meta folder to write")
    ap.add_argument("--tiny", action="store_true", help="a seconds-long run of every stage (for tests)")
    ap.add_argument("--resume", action="store_true", help="continue training from work/ckpt.pt")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a Config field, e.g. --set dim=128 --set train_minutes=3")
    a = ap.parse_args(argv)
    cfg = Config.tiny() if a.tiny else Config()
    for kv in a.set:
        k, _, v = kv.partition("=")
        f = {f.name: f for f in dataclasses.fields(Config)}.get(k)
        if f is None:
            ap.error(f"unknown setting {k!r}")
        cur = getattr(cfg, k)
        setattr(cfg, k, type(cur)(json.loads(v)) if not isinstance(cur, str) else v)
    threads = torch.get_num_threads()
    # On a busy 2-core machine one thread can be several times faster than two (measured:
    # OpenMP threads spin waiting for a core); `--set threads=N` picks.
    torch.set_num_threads(cfg.threads)
    stages = ["corpus", "tokenizer", "train", "export", "eval"] if a.stage == "all" else [a.stage]
    try:
        for st in stages:
            if st == "corpus":
                stage_corpus(cfg, a.work)
            elif st == "tokenizer":
                stage_tokenizer(cfg, a.work)
            elif st == "train":
                stage_train(cfg, a.work, resume=a.resume or a.stage == "all")
            elif st == "export":
                stage_export(cfg, a.work, a.out)
            elif st == "eval":
                stage_eval(cfg, a.work, a.out)
    finally:
        torch.set_num_threads(threads)  # callers in the same process (tests) keep theirs
    return 0


if __name__ == "__main__":
    sys.exit(main())
