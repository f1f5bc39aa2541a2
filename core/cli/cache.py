"""``python -m core cache``: the packed-layer caches that make a GGUF's second open fast
(:mod:`core.checkpoints.pack_cache`), listed with their size, or removed."""
from __future__ import annotations

import json
import sys

from core.checkpoints import pack_cache
from core.cli.common import write_stdout
from core.library.library import human_size


def cmd_cache(args) -> int:
    caches = pack_cache.list_caches()
    if args.clear:
        for c in caches:
            pack_cache.remove(c.path)
        print(f"removed {len(caches)} packed cache(s), {human_size(sum(c.bytes for c in caches))}",
              file=sys.stderr)
        return 0
    if args.json:
        write_stdout(json.dumps([{"path": str(c.path), "source": c.source, "bytes": c.bytes} for c in caches],
                                ensure_ascii=False) + "\n")
        return 0
    if not caches:
        print(f"no packed caches in {pack_cache.cache_folder()}", file=sys.stderr)
        return 0
    rows = [("SIZE", "FOR")] + [(human_size(c.bytes), c.source or str(c.path)) for c in caches]
    width = max(len(r[0]) for r in rows)
    write_stdout("".join(f"{a.ljust(width)}  {b}\n" for a, b in rows))
    return 0
