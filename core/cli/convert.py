"""``python -m core convert``: write a model as a Hugging Face or Meta folder, or a GGUF file
(core/checkpoints/convert.py)."""
from __future__ import annotations

import json

from core.checkpoints.convert import convert


def cmd_convert(args) -> int:
    """Errors propagate as CheckpointError (the CLI prints one line, exit 2)."""
    dst = convert(args.src, args.dst, fmt=args.fmt, dtype=args.dtype, overwrite=args.overwrite, qtype=args.qtype)
    files = sorted(p.name for p in dst.iterdir()) if dst.is_dir() else [dst.name]
    if args.json:
        print(json.dumps({"dst": str(dst), "format": args.fmt, "files": files}))
    else:
        print(f"wrote {dst} ({', '.join(files)})")
    return 0
