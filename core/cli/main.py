"""Command line: ``python -m core generate|compare|serve|tokenize|info|convert|pull|models|cache|documents|tools``.

This module builds the parser and dispatches; each command family lives in its own module
(generate, compare, serve, info, convert, library), the options several share in
common.py, where a command's model runs in backends.py. stdout carries the text (or one
JSON object with --json); every user error exits with status 2 and one line on stderr,
never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

import torch

from core.checkpoints.gguf_write import GGUF_TYPES
from core.cli.common import (BACKEND_KEYS, CHAT_FORMATS, add_bias_opts, add_constraint_opts, add_tool_opts,
                             add_model_opts, add_prompt_opts, add_sampling_opts, add_server_opts, add_spec_opts)
from core.cli.documents import add_document_opts, documents_parser
from core.cli.exits import Parser, UsageError, guarded  # noqa: F401  (UsageError: what a bad flag raises)
from core.cli.tool_opts import add_tool_opts as add_toolbox_opts, add_tools_parser
from core.engine.lanes import LANE_SPEC_KEYS
from core.errors import SettingsError
from core.tokenizer.base import valid_text

# command -> (module, function); a command's module loads when it runs.
COMMANDS = {"generate": ("core.cli.generate", "cmd_generate"), "compare": ("core.cli.compare", "cmd_compare"),
            "serve": ("core.cli.serve", "cmd_serve"), "tokenize": ("core.cli.info", "cmd_tokenize"),
            "info": ("core.cli.info", "cmd_info"), "pull": ("core.cli.library", "cmd_pull"),
            "models": ("core.cli.library", "cmd_models"), "convert": ("core.cli.convert", "cmd_convert"),
            "cache": ("core.cli.cache", "cmd_cache"), "documents": ("core.cli.documents", "cmd_documents"),
            "tools": ("core.cli.tools", "cmd_tools")}



def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog="python -m core", description="LlamaDesk core: run LLaMA-family models.")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    _generate_parser(sub)
    _compare_parser(sub)
    _serve_parser(sub)
    _inspect_parsers(sub)
    _convert_parser(sub)
    _library_parsers(sub)
    documents_parser(sub)
    add_tools_parser(sub)
    return ap


def _generate_parser(sub) -> None:
    g = sub.add_parser("generate", help="generate a continuation or a chat reply")
    g.add_argument("model", nargs="?", help="Meta folder, Hugging Face folder or .gguf file (or --server)")
    add_server_opts(g)
    add_prompt_opts(g)
    add_sampling_opts(g)
    add_bias_opts(g)
    add_spec_opts(g)
    add_constraint_opts(g)
    add_tool_opts(g)
    tb = g.add_argument_group("tools that run here (with --chat): the reply goes on with their results")
    add_toolbox_opts(tb)
    tb.add_argument("--max-tool-rounds", type=int, default=8, metavar="N",
                    help="stop after N rounds of calls (default 8)")
    add_model_opts(g)
    add_document_opts(g)


def _compare_parser(sub) -> None:
    c = sub.add_parser("compare", help="run one prompt under several sampler settings together")
    c.add_argument("model", nargs="?", help="the lanes' model (or --server, or model=/server= in each lane)")
    add_server_opts(c)
    add_prompt_opts(c)
    c.add_argument("--lane", action="append", required=True, metavar="SPEC",
                   help="comma-separated key=value over " + ", ".join((*LANE_SPEC_KEYS, *BACKEND_KEYS))
                   + " (model=PATH: another local checkpoint; server=URL[,model=NAME]: a model on a server; "
                   "json_schema=@FILE, regex=RE|@FILE, grammar=@FILE, json_object=1 or constraint=none: the lane's "
                   "constraint; logit_bias=TEXT=BIAS, repeatable: the lane's logit bias after --logit-bias's)")
    add_bias_opts(c)
    add_spec_opts(c)
    add_constraint_opts(c, lanes=True)
    add_model_opts(c)


def _serve_parser(sub) -> None:
    s = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    s.add_argument("model", help="Meta folder, Hugging Face folder or .gguf file")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (other than loopback needs --api-key)")
    s.add_argument("--port", type=int, default=8000, help="TCP port (0: any free port)")
    s.add_argument("--api-key", default=os.environ.get("LLAMADESK_API_KEY"),
                   help="clients must send 'Authorization: Bearer KEY' (default: $LLAMADESK_API_KEY)")
    s.add_argument("--max-batch", type=int, default=16, help="most sequences decoded together")
    s.add_argument("--max-queue", type=int, default=64, help="most requests waiting; more get 503")
    s.add_argument("--model-name", default=None, help="the model id clients use (default: the folder or file name); "
                   "NAME,ALIAS,... answers to each, replies say the first")
    s.add_argument("--any-model-name", action="store_true",
                   help="answer a request whatever model it names, as llama.cpp's server does (OpenAI answers 404)")
    s.add_argument("--lookup", type=int, default=0, metavar="N",
                   help="requests draft by prompt lookup over the last N tokens (1-8) unless they say otherwise "
                        "(request field lookup; same output, faster when replies repeat their prompt)")
    s.add_argument("--draft", default=None, metavar="MODEL",
                   help="load a smaller draft MODEL of the same vocabulary; requests draft with it unless they say "
                        "otherwise (request field draft: true, false or its name)")
    s.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch threads for the model (default: $LLAMADESK_THREADS, else the CPU probe's plan over "
                        "every core but one, which the HTTP side keeps)")
    s.add_argument("--allowed-hosts", action="append", default=[], metavar="NAME[,NAME]",
                   help="Host names a server without --api-key answers besides localhost, 127.0.0.1, [::1] "
                        "and the bound address")
    s.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="let web pages from ORIGIN (e.g. http://localhost:3000) call the server; none by default")
    s.add_argument("--max-body", type=int, default=8 << 20, metavar="BYTES",
                   help="largest request body taken; larger ones get 413 (default: 8 MiB)")
    s.add_argument("--read-timeout", type=float, default=30.0, metavar="S",
                   help="seconds a client has to send a request's headers, and then its body (408 after)")
    s.add_argument("--shutdown-timeout", type=float, default=10.0, metavar="S",
                   help="on Ctrl+C, seconds running requests have to finish before they are ended")
    add_model_opts(s)


def _inspect_parsers(sub) -> None:
    t = sub.add_parser("tokenize", help="print the token ids of a text as a JSON array")
    t.add_argument("model", help="a model (folder or .gguf) or a tokenizer file")
    t.add_argument("--text", required=True)
    t.add_argument("--bos", action="store_true")
    t.add_argument("--eos", action="store_true")
    t.add_argument("--chat", action="store_true")
    t.add_argument("--system", default=None)
    t.add_argument("--chat-format", default="auto", choices=CHAT_FORMATS)

    i = sub.add_parser("info", help="describe a model as one JSON object")
    i.add_argument("model")
    add_model_opts(i)
    i.add_argument("--quality", action="store_true",
                   help="add perplexity on a held-out text and greedy agreement over 256 tokens against float32")


def _convert_parser(sub) -> None:
    p = sub.add_parser("convert", help="write a model as a Hugging Face or Meta folder, or a GGUF file")
    p.add_argument("src", help="Meta folder, Hugging Face folder or .gguf file")
    p.add_argument("dst", help="folder (hf, meta) or file (gguf) to write")
    p.add_argument("--to", dest="fmt", default="hf", choices=["hf", "meta", "gguf"])
    p.add_argument("--type", dest="qtype", default="Q8_0", choices=GGUF_TYPES,
                   help="GGUF tensor type of the matrices (with --to gguf)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty DST")
    p.add_argument("--json", action="store_true", help="print one JSON object describing the result")


def _library_parsers(sub) -> None:
    p = sub.add_parser("pull", help="download a model from the Hugging Face Hub into the models folder")
    p.add_argument("repo", help="the repository, e.g. bartowski/Llama-3.2-1B-Instruct-GGUF")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--file", default=None, metavar="NAME",
                       help="the .gguf file (or safetensors folder) to get; default: the recommended one")
    which.add_argument("--quant", default=None, metavar="Q", help="the quantization to get, e.g. Q4_K_M")
    p.add_argument("--endpoint", default=None, metavar="URL", help="the Hub's address (default: $HF_ENDPOINT or huggingface.co)")
    p.add_argument("--token", default=None, help="a Hugging Face token for gated or private repositories "
                                                 "(default: $HF_TOKEN or the one 'hf auth login' stored)")
    p.add_argument("--dest", default=None, metavar="FOLDER", help="where to put it (default: the library's models folder)")
    p.add_argument("--context", type=int, default=4096, help="context length the recommendation plans for (default 4096)")
    p.add_argument("--json", action="store_true", help="print one JSON object when done")

    c = sub.add_parser("cache", help="list (or --clear) the packed-layer caches that make a GGUF's next open fast")
    c.add_argument("--clear", action="store_true", help="remove every packed cache")
    c.add_argument("--json", action="store_true", help="print a JSON array instead of a table")

    m = sub.add_parser("models", help="list the models in the library (models folder and extra folders)")
    m.add_argument("--folder", action="append", default=[], metavar="FOLDER",
                   help="scan this folder too (repeatable)")
    m.add_argument("--json", action="store_true", help="print a JSON array instead of a table")


def _valid_arguments(args) -> None:
    """Text arguments that were not valid UTF-8 (lone surrogates after Python's decoding)
    get U+FFFD in place of the bad bytes, with a warning."""
    for name in ("prompt", "system", "text"):
        v = getattr(args, name, None)
        if isinstance(v, str):
            fixed = valid_text(v)
            if fixed != v:
                setattr(args, name, fixed)
                print(f"warning: --{name} was not valid UTF-8; the bad bytes were replaced with U+FFFD",
                      file=sys.stderr)


def run(args) -> int:
    """Run the parsed command."""
    if getattr(args, "draft", None) is not None and not args.draft.strip():
        raise SettingsError("--draft needs a draft model's path (a .gguf file or a model folder)")
    _valid_arguments(args)
    torch.set_num_threads(os.cpu_count() or 1)  # the CLI owns the machine
    module, name = COMMANDS[args.cmd]
    # start-up: a command loads only its own dependencies (the Hub client, the HTTP server)
    return getattr(importlib.import_module(module), name)(args)


def main(argv: list[str] | None = None) -> int:
    return guarded(lambda: run(build_parser().parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
