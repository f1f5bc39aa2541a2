"""Command line: ``python -m core generate|compare|tokenize|info|convert``.

stdout carries the text (or one JSON object with --json); every user error exits with
status 2 and one line on stderr, never a traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from .errors import LlamaDeskError, SettingsError

LANE_KEYS = {
    "temperature": float, "top_p": float, "top_k": int, "min_p": float,
    "repetition_penalty": float, "seed": int, "max_new_tokens": int,
}


class UsageError(LlamaDeskError):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse would print the usage too)
        raise UsageError(f"{self.prog}: {message}")


def _add_model_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])


def _add_prompt_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompt", required=True, help="the prompt text ('' means BOS alone)")
    p.add_argument("--chat", action="store_true", help="render the prompt as a user message in the model's chat format")
    p.add_argument("--system", default=None, help="system prompt (with --chat)")
    p.add_argument("--chat-format", default="auto", choices=["auto", "llama3", "llama2", "raw"])
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="python -m core", description="LlamaDesk core: run LLaMA-family models.")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="generate a continuation or a chat reply")
    g.add_argument("model", help="Meta folder, Hugging Face folder or .gguf file")
    _add_prompt_opts(g)
    g.add_argument("--temperature", type=float, default=0.8)
    g.add_argument("--top-p", type=float, default=0.95)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--repetition-penalty", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--num-beams", type=int, default=1)
    g.add_argument("--length-penalty", type=float, default=1.0)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    _add_model_opts(g)

    c = sub.add_parser("compare", help="run one prompt under several sampler settings together")
    c.add_argument("model")
    _add_prompt_opts(c)
    c.add_argument("--lane", action="append", required=True, metavar="SPEC",
                   help="comma-separated key=value over " + ", ".join(LANE_KEYS))
    _add_model_opts(c)

    t = sub.add_parser("tokenize", help="print the token ids of a text as a JSON array")
    t.add_argument("model", help="a model (folder or .gguf) or a tokenizer file")
    t.add_argument("--text", required=True)
    t.add_argument("--bos", action="store_true")
    t.add_argument("--eos", action="store_true")
    t.add_argument("--chat", action="store_true")
    t.add_argument("--system", default=None)
    t.add_argument("--chat-format", default="auto", choices=["auto", "llama3", "llama2", "raw"])

    i = sub.add_parser("info", help="describe a model as one JSON object")
    i.add_argument("model")
    _add_model_opts(i)

    try:
        from .convert import add_convert_parser
    except ImportError:
        pass
    else:
        add_convert_parser(sub)
    return ap


def _load(args):
    from .checkpoints import load
    t0 = time.perf_counter()
    loaded = load(args.model, device=args.device, dtype=args.dtype)
    return loaded, time.perf_counter() - t0


def _messages(args) -> list[dict]:
    msgs = []
    if args.system:
        msgs.append({"role": "system", "content": args.system})
    msgs.append({"role": "user", "content": args.prompt})
    return msgs


def _prompt_ids(loaded, args) -> tuple[list[int], bool]:
    """(ids, strip_leading_space) for the prompt as the user asked for it."""
    from .chat_format import chat_format_for
    tok = loaded.tokenizer
    if args.chat:
        fmt = loaded.chat_format if args.chat_format == "auto" else chat_format_for(tok, override=args.chat_format)
        return fmt.encode_dialog(_messages(args)), bool(getattr(tok, "add_dummy_prefix", False))
    if args.system:
        raise SettingsError("--system needs --chat")
    return tok.encode(args.prompt, bos=True), False


def _lane_spec(spec: str, default_max: int | None):
    from .sampling import SamplingParams
    kw: dict = {}
    for part in filter(None, (s.strip() for s in spec.split(","))):
        key, eq, val = part.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or key not in LANE_KEYS:
            raise SettingsError(f"bad lane setting '{part}': use key=value with key one of {', '.join(LANE_KEYS)}")
        try:
            kw[key] = LANE_KEYS[key](val.strip())
        except ValueError:
            raise SettingsError(f"bad value for {key} in lane '{spec}': {val.strip()!r}") from None
    if "max_new_tokens" not in kw and default_max:
        kw["max_new_tokens"] = default_max
    return SamplingParams(**kw).validate()


def cmd_generate(args) -> int:
    from .engine import Done, Engine, Token
    from .sampling import SamplingParams
    params = SamplingParams(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
        repetition_penalty=args.repetition_penalty, seed=args.seed,
        max_new_tokens=args.max_new_tokens or 256, stop=tuple(args.stop),
        num_beams=args.num_beams, length_penalty=args.length_penalty).validate().resolved()
    loaded, load_s = _load(args)
    ids, strip = _prompt_ids(loaded, args)
    engine = Engine(loaded.model, loaded.tokenizer, stop_ids=loaded.stop_ids)
    done = None
    for ev in engine.generate(ids, params, strip_leading_space=strip):
        if isinstance(ev, Token) and not args.json and ev.text:
            sys.stdout.write(ev.text)
            sys.stdout.flush()
        elif isinstance(ev, Done):
            done = ev
    if args.json:
        st = done.stats
        print(json.dumps({
            "text": done.text, "prompt_tokens": ids, "tokens": done.tokens, "logprobs": done.logprobs,
            "stop_reason": done.stop_reason, "seed": params.seed,
            "timings": {"load_s": load_s, "prefill_s": st.prefill_s, "decode_s": st.decode_s,
                        "prefill_tok_s": st.prefill_tok_s, "decode_tok_s": st.decode_tok_s},
        }, ensure_ascii=False))
    else:
        sys.stdout.write("\n")
    return 0


def cmd_compare(args) -> int:
    from .engine import Done, Engine
    lanes = [_lane_spec(s, args.max_new_tokens).resolved() for s in args.lane]
    if len(lanes) > 8:
        raise SettingsError(f"at most 8 lanes, got {len(lanes)}")
    loaded, load_s = _load(args)
    ids, strip = _prompt_ids(loaded, args)
    engine = Engine(loaded.model, loaded.tokenizer, stop_ids=loaded.stop_ids)
    t0 = time.perf_counter()
    results: dict[int, Done] = {}
    prefill_s = 0.0
    for ev in engine.generate_lanes(ids, lanes, strip_leading_space=strip):
        if isinstance(ev, Done):
            results[ev.lane] = ev
        elif hasattr(ev, "cached_tokens"):
            prefill_s = ev.seconds
    total = time.perf_counter() - t0
    out = [results[i] for i in range(len(lanes))]
    if args.json:
        print(json.dumps({
            "prompt_tokens": ids,
            "lanes": [{"settings": d.params.to_dict(), "text": d.text, "tokens": d.tokens, "logprobs": d.logprobs,
                       "stop_reason": d.stop_reason, "stats": d.stats.to_dict()} for d in out],
            "timings": {"load_s": load_s, "prefill_s": prefill_s, "decode_s": total - prefill_s, "total_s": total},
        }, ensure_ascii=False))
        return 0
    for d in out:
        p = d.params
        print(f"── lane {d.lane + 1}: temperature={p.temperature} top_p={p.top_p} top_k={p.top_k} "
              f"min_p={p.min_p} repetition_penalty={p.repetition_penalty} seed={p.seed} "
              f"· {len(d.tokens)} tokens · {d.stop_reason}")
        print(d.text)
        print()
    return 0


def cmd_tokenize(args) -> int:
    from .chat_format import chat_format_for
    path = Path(args.model).expanduser()
    if not path.exists():
        raise SettingsError(f"no such file or folder: {path}")
    if path.is_dir() or path.read_bytes()[:4] == b"GGUF":
        from .checkpoints import load
        loaded = load(path, device="cpu", dtype="float32")
        tok, fmt = loaded.tokenizer, loaded.chat_format
    else:
        from .tokenizer import load_tokenizer
        tok = load_tokenizer(path)
        fmt = chat_format_for(tok)
    if args.chat:
        if args.chat_format != "auto":
            fmt = chat_format_for(tok, override=args.chat_format)
        msgs = ([{"role": "system", "content": args.system}] if args.system else [])
        ids = fmt.encode_dialog(msgs + [{"role": "user", "content": args.text}])
    else:
        ids = tok.encode(args.text, bos=args.bos, eos=args.eos)
    print(json.dumps(ids))
    return 0


def cmd_info(args) -> int:
    loaded, load_s = _load(args)
    info = dict(loaded.info)
    info["load_s"] = round(load_s, 3)
    print(json.dumps(info, ensure_ascii=False, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.cmd in ("generate", "compare") and args.max_new_tokens is not None and args.max_new_tokens < 1:
            raise SettingsError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
        import torch
        torch.set_num_threads(os.cpu_count() or 1)  # the CLI owns the machine
        handler = {"generate": cmd_generate, "compare": cmd_compare, "tokenize": cmd_tokenize,
                   "info": cmd_info}.get(args.cmd)
        if handler is None:
            from .convert import run_convert
            return run_convert(args)
        return handler(args)
    except LlamaDeskError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except MemoryError:
        print("error: out of memory while loading or running the model", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e.strerror or e}: {e.filename or ''}".rstrip(": "), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
