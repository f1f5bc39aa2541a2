"""``python -m core info`` and ``python -m core tokenize``: what a model is, and how its
tokenizer splits a text."""
from __future__ import annotations

import json
from pathlib import Path

from core import limits
from core.checkpoints import load
from core.checkpoints.quality import compare
from core.cli.backends import engine_for, load_model, thread_plan
from core.cli.common import write_stdout
from core.errors import SettingsError
from core.prompt.chat_format import chat_format_for
from core.tokenizer import load_tokenizer


def cmd_tokenize(args) -> int:
    path = Path(args.model).expanduser()
    if not path.exists():
        raise SettingsError(f"no such file or folder: {path}")
    # Only the magic is read: the file may be a multi-GB GGUF (or a FIFO, refused).
    if path.is_dir() or limits.read_head(path, 4, error=SettingsError) == b"GGUF":
        loaded = load(path, device="cpu", dtype="float32")
        tok, fmt = loaded.tokenizer, loaded.chat_format
    else:
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
    loaded, load_s = load_model(args)
    info = dict(loaded.info)
    info["load_s"] = round(load_s, 3)
    plan = thread_plan(loaded)
    if plan is not None:
        info["threads"] = plan.reason
    info["decode"] = engine_for(loaded, args).compile_status  # "compiles at the first decode step (...)" with --compile
    if args.quality:
        reference = load(args.model, device=args.device, dtype="float32")
        info["quality"] = compare(loaded.model, reference.model, loaded.tokenizer)
    path = Path(args.model).expanduser()
    links = limits.symlinks_in([path] + (sorted(path.iterdir()) if path.is_dir() else []))
    if links:  # followed, but said: the files read are not where they seem to be
        info["symlinks"] = links
    write_stdout(json.dumps(info, ensure_ascii=False, default=str) + "\n")  # a non-UTF-8 name as its bytes
    return 0
