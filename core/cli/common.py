"""What several commands share: option builders, what the options mean as settings, how
a reply's ending is reported, and text on stdout.

The sampling flags are built from the settings schema (:func:`setting_flag`); a compare
lane's keys are the schema's too (:func:`core.engine.lanes.parse_lane_spec`).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from core.checkpoints.common import DTYPE_CHOICES
from core.cli.exits import write_stdout  # noqa: F401  (the commands' writer, declared there torch-free)
from core.cli.tool_opts import wants_toolbox
from core.engine.constraint import Constraint, from_argument
from core.engine.settings import SCHEMA, parse_logit_bias
from core.errors import SettingsError
from core.limits import read_limited
from core.tools.spec import Tool, ToolError, tools_from_openai

MAX_TOOLS_FILE = 8 << 20  # a tools file: 128 tools of up to 64,000 characters of schema each, with room
SPEC_KEYS = ("lookup", "draft")  # speculative decoding: a lane that sets one ignores --lookup/--draft
BACKEND_KEYS = ("model", "server")  # a lane's own model: a local path, or a model on a server
CHAT_FORMATS = ["auto", "llama3", "llama2", "raw"]


# generate's sampler flags, each declared in the settings schema (type, range, default, help).
SAMPLING_FLAGS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "num_beams", "length_penalty")


def setting_flag(p: argparse.ArgumentParser, name: str, **kw) -> None:
    """The schema's setting ``name`` as the flag --NAME: argparse refuses a value outside
    its declared range with the schema's message (exit 2, one line); ``kw`` overrides
    (a default of None where "not given" means something)."""
    s = SCHEMA[name]

    def value(text: str):
        try:
            return s.from_text(text)
        except SettingsError as e:  # out of range
            raise argparse.ArgumentTypeError(str(e)) from None
        except ValueError:  # argparse's own words for a bad int or float
            raise argparse.ArgumentTypeError(f"invalid {s.kind.__name__} value: {text!r}") from None

    value.__name__ = s.kind.__name__
    default = kw.pop("default", s.default)
    shown = "none" if default is None else default
    p.add_argument(s.flag_name, type=value, default=default,
                   help=f"{s.help} ({s.range_text()}; default {shown})", **kw)


def add_sampling_opts(p: argparse.ArgumentParser) -> None:
    """The sampler's flags (generate)."""
    for name in SAMPLING_FLAGS:
        setting_flag(p, name)
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
    setting_flag(p, "lookup", metavar="N")
    p.add_argument("--draft", default=None, metavar="MODEL", help=SCHEMA["draft"].help)


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
    setting_flag(p, "max_new_tokens", default=None)  # none: the lanes' own, else 256
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")


def add_tool_opts(p: argparse.ArgumentParser) -> None:
    t = p.add_argument_group("tool calling (with --chat)")
    t.add_argument("--tools", metavar="FILE.json",
                   help='the functions the reply may call: a JSON list of OpenAI tool definitions, or {"tools": [...]}')
    t.add_argument("--tool-choice", default="auto", metavar="CHOICE", help=SCHEMA["tool_choice"].help + " (default auto)")
    t.add_argument("--tool-constraint", default="on", choices=["on", "off"], help=SCHEMA["tool_constraint"].help)
    t.add_argument("--no-parallel-tool-calls", action="store_true", help="at most one call per reply")


def tools_from_args(args) -> list[Tool]:
    """The tools --tools declares (SettingsError, exit 2, for a file that is not a tools list)."""
    path = getattr(args, "tools", None)
    if not path:
        if getattr(args, "tool_choice", "auto") not in ("auto", "none") and not wants_toolbox(args):
            raise SettingsError(f"--tool-choice {args.tool_choice} needs --tools FILE.json (or --builtin/--mcp)")
        return []
    if not args.chat:
        raise SettingsError("--tools needs --chat: a completion makes no calls")
    data = read_limited(path, MAX_TOOLS_FILE, error=SettingsError)
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise SettingsError(f"--tools {path}: not JSON ({str(e)[:120]})") from None
    if isinstance(value, dict) and "tools" in value:
        value = value["tools"]
    try:
        return tools_from_openai(value)
    except ToolError as e:
        raise SettingsError(f"--tools {path}: {e}") from None


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


def beams_json(done) -> dict:
    """A beam search's Done as --json says it: every beam it returned, best first (the
    first is the reply itself); nothing for a sampled reply."""
    return {"beams": [{"text": b.text, "tokens": b.tokens, "logprobs": b.logprobs, "score": b.score,
                       "stop_reason": b.stop_reason} for b in done.beams]} if done.beams else {}


def spec_note(stats) -> str:
    """' · lookup 3: 12/20 drafted tokens accepted' for a reply that drafted, else ''."""
    sp = getattr(stats, "speculative", None) if stats is not None else None
    if not sp:
        return ""
    how = f"lookup {sp['lookup']}" if sp["kind"] == "lookup" else f"draft {Path(sp['draft']).name}"
    return f" · {how}: {sp['accepted']}/{sp['drafted']} drafted tokens accepted"


