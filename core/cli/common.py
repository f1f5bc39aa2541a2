"""What several commands share: option builders, what the options mean as settings, how
a reply's ending is reported, and text on stdout.

The sampling flags are declared in one place, :func:`add_sampling_opts`; a compare lane's
keys in :data:`LANE_KEYS`.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from core.checkpoints.common import DTYPE_CHOICES
from core.engine.constraint import Constraint, from_argument
from core.engine.settings import parse_logit_bias
from core.errors import SettingsError

# A compare lane's settings: key=value, the value parsed by the type given.
LANE_KEYS = {
    "temperature": float, "top_p": float, "top_k": int, "min_p": float,
    "repetition_penalty": float, "seed": int, "max_new_tokens": int, "lookup": int, "draft": str,
    "logit_bias": str,  # TEXT=BIAS, repeatable in a lane: logit_bias=girl=-inf,logit_bias=Lily=+5
    "logit_bias_id": str,  # ID=BIAS by token id, repeatable (ID=-inf bans it, as the chat's "Ban and retry")
}
SPEC_KEYS = ("lookup", "draft")  # speculative decoding: a lane that sets one ignores --lookup/--draft
BACKEND_KEYS = ("model", "server")  # a lane's own model: a local path, or a model on a server
CONSTRAINT_KEYS = ("json_schema", "json_object", "regex", "grammar", "constraint")
CHAT_FORMATS = ["auto", "llama3", "llama2", "raw"]


def add_sampling_opts(p: argparse.ArgumentParser) -> None:
    """The sampler's flags (generate)."""
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--num-beams", type=int, default=1)
    p.add_argument("--length-penalty", type=float, default=1.0)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def add_model_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    p.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                   help="int8/int4: quantize linear weights at load (weight-only)")
    p.add_argument("--compile", action="store_true",
                   help="decode through torch.compile: on CUDA a static KV cache captured as CUDA graphs, "
                        "on the CPU inductor's C++ kernels (the first reply waits minutes for the compiler; "
                        "eager if it fails)")


def add_spec_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lookup", type=int, default=0, metavar="N",
                   help="speculative decoding by prompt lookup: draft what followed the last N tokens "
                        "earlier in the context (1-8; same output, faster when the reply repeats the prompt)")
    p.add_argument("--draft", default=None, metavar="MODEL",
                   help="speculative decoding with a smaller draft MODEL of the same vocabulary (same output)")


def add_bias_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--logit-bias", action="append", default=[], metavar="TEXT=BIAS",
                   help="add BIAS (-100 to 100, or -inf: never) to the logits of TEXT's tokens before the "
                        "filters, e.g. ' dragon=+5' or 'Once=-inf' (repeatable; TEXT is plain text, as the "
                        "model's tokenizer splits it)")


def add_server_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", default=None, metavar="URL",
                   help="run on an OpenAI-compatible server (python -m core serve, vLLM, llama.cpp, Ollama) instead of MODEL")
    p.add_argument("--api-key", default=os.environ.get("LLAMADESK_API_KEY"),
                   help="the server's API key (default: $LLAMADESK_API_KEY)")
    p.add_argument("--model", dest="remote_model", default=None, metavar="NAME",
                   help="the model on the server (default: its first)")


def add_prompt_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompt", required=True, help="the prompt text ('' means BOS alone)")
    p.add_argument("--chat", action="store_true", help="render the prompt as a user message in the model's chat format")
    p.add_argument("--system", default=None, help="system prompt (with --chat)")
    p.add_argument("--chat-format", default="auto", choices=CHAT_FORMATS)
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")


def add_constraint_opts(p: argparse.ArgumentParser, lanes: bool = False) -> None:
    c = p.add_mutually_exclusive_group()
    every = " (every lane; a lane's own json_schema=/regex=/grammar=/constraint=none wins)" if lanes else ""
    c.add_argument("--json-schema", metavar="SCHEMA", help="hold the output to a JSON schema (text, or @FILE)" + every)
    c.add_argument("--json-object", action="store_true", help="hold the output to any JSON object" + every)
    c.add_argument("--regex", metavar="RE", help="the whole output matches a regular expression (or @FILE)" + every)
    c.add_argument("--grammar", metavar="GRAMMAR", help="hold the output to a GBNF or Lark grammar (text, or @FILE)" + every)


# -- the options as settings ------------------------------------------------------------


def constraint_from_args(args) -> Constraint | None:
    """The constraint --json-schema / --json-object / --regex / --grammar ask for."""
    for kind in ("json_schema", "regex", "grammar"):
        if getattr(args, kind, None) is not None:
            return from_argument(kind, getattr(args, kind))
    return from_argument("json_object", "") if getattr(args, "json_object", False) else None


def check_bias(args) -> None:
    """Refuse a malformed --logit-bias before any model loads."""
    for spec in args.logit_bias:
        parse_logit_bias(spec, lambda text: [0])
    if args.logit_bias and args.server:
        raise SettingsError("--logit-bias needs a local model: a server's token ids are its own "
                            "(send logit_bias in the request instead)")


def logit_bias_ids(args, tokenizer) -> dict[int, float]:
    """--logit-bias as {token id: bias} in this model's vocabulary (later specs win)."""
    out: dict[int, float] = {}
    for spec in args.logit_bias:
        out.update(parse_logit_bias(spec, tokenizer.encode))
    return out


# -- how replies ended ------------------------------------------------------------------


def ended_in_error(dones) -> int:
    """2 and one line on stderr when a reply (the first such lane) stopped on an error
    mid-reply (its output format went past the grammar engine's limits, NaN logits);
    what it generated before is printed already."""
    for i, d in enumerate(dones):
        if d.stop_reason == "error":
            where = f"lane {i + 1}: " if len(dones) > 1 else ""
            print(f"error: {where}{d.error or 'the reply stopped on an error'}", file=sys.stderr)
            return 2
    return 0


def spec_note(stats) -> str:
    """' · lookup 3: 12/20 drafted tokens accepted' for a reply that drafted, else ''."""
    sp = getattr(stats, "speculative", None) if stats is not None else None
    if not sp:
        return ""
    how = f"lookup {sp['lookup']}" if sp["kind"] == "lookup" else f"draft {Path(sp['draft']).name}"
    return f" · {how}: {sp['accepted']}/{sp['drafted']} drafted tokens accepted"


def write_stdout(text: str) -> None:
    """``text`` on stdout as UTF-8, with a file name that is not UTF-8 (lone surrogates
    after Python's decoding) written as the bytes it is."""
    sys.stdout.flush()
    sys.stdout.buffer.write(text.encode("utf-8", "surrogateescape"))
    sys.stdout.flush()
