"""Command line: ``python -m core generate|compare|serve|tokenize|info|convert|pull|models``.

stdout carries the text (or one JSON object with --json); every user error exits with
status 2 and one line on stderr, never a traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from core.errors import LlamaDeskError, SettingsError

LANE_KEYS = {
    "temperature": float, "top_p": float, "top_k": int, "min_p": float,
    "repetition_penalty": float, "seed": int, "max_new_tokens": int, "lookup": int, "draft": str,
    "logit_bias": str,  # TEXT=BIAS, repeatable in a lane: logit_bias=girl=-inf,logit_bias=Lily=+5
    "logit_bias_id": str,  # ID=BIAS by token id, repeatable (ID=-inf bans it, as the chat's "Ban and retry")
}
SPEC_KEYS = ("lookup", "draft")  # speculative decoding: a lane that sets one ignores --lookup/--draft
BACKEND_KEYS = ("model", "server")  # a lane's own model: a local path, or a model on a server


class UsageError(LlamaDeskError):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse would print the usage too)
        raise UsageError(f"{self.prog}: {message}")


def _add_model_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    from core.checkpoints.common import DTYPE_CHOICES
    p.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                   help="int8/int4: quantize linear weights at load (weight-only)")
    p.add_argument("--compile", action="store_true",
                   help="decode through torch.compile: on CUDA a static KV cache captured as CUDA graphs, "
                        "on the CPU inductor's C++ kernels (the first reply waits minutes for the compiler; "
                        "eager if it fails)")


def _add_spec_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lookup", type=int, default=0, metavar="N",
                   help="speculative decoding by prompt lookup: draft what followed the last N tokens "
                        "earlier in the context (1-8; same output, faster when the reply repeats the prompt)")
    p.add_argument("--draft", default=None, metavar="MODEL",
                   help="speculative decoding with a smaller draft MODEL of the same vocabulary (same output)")


def _add_bias_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--logit-bias", action="append", default=[], metavar="TEXT=BIAS",
                   help="add BIAS (-100 to 100, or -inf: never) to the logits of TEXT's tokens before the "
                        "filters, e.g. ' dragon=+5' or 'Once=-inf' (repeatable; TEXT is plain text, as the "
                        "model's tokenizer splits it)")


def _check_bias(args) -> None:
    """Refuse a malformed --logit-bias before any model loads."""
    from core.engine.sampling import parse_logit_bias
    for spec in args.logit_bias:
        parse_logit_bias(spec, lambda text: [0])
    if args.logit_bias and args.server:
        raise SettingsError("--logit-bias needs a local model: a server's token ids are its own "
                            "(send logit_bias in the request instead)")


def _logit_bias(args, tokenizer) -> dict[int, float]:
    """--logit-bias as {token id: bias} in this model's vocabulary (later specs win)."""
    from core.engine.sampling import parse_logit_bias
    out: dict[int, float] = {}
    for spec in args.logit_bias:
        out.update(parse_logit_bias(spec, tokenizer.encode))
    return out


def _app_draft_loader(engine):
    """The app's own draft loader (core.worker.worker.draft_loader): one path for the app, the CLI
    and serve."""
    from core.worker.worker import draft_loader
    return draft_loader(engine)


def _add_server_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", default=None, metavar="URL",
                   help="run on an OpenAI-compatible server (python -m core serve, vLLM, llama.cpp, Ollama) instead of MODEL")
    p.add_argument("--api-key", default=os.environ.get("LLAMADESK_API_KEY"),
                   help="the server's API key (default: $LLAMADESK_API_KEY)")
    p.add_argument("--model", dest="remote_model", default=None, metavar="NAME",
                   help="the model on the server (default: its first)")


def _add_prompt_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompt", required=True, help="the prompt text ('' means BOS alone)")
    p.add_argument("--chat", action="store_true", help="render the prompt as a user message in the model's chat format")
    p.add_argument("--system", default=None, help="system prompt (with --chat)")
    p.add_argument("--chat-format", default="auto", choices=["auto", "llama3", "llama2", "raw"])
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")


def _add_constraint_opts(p: argparse.ArgumentParser, lanes: bool = False) -> None:
    c = p.add_mutually_exclusive_group()
    every = " (every lane; a lane's own json_schema=/regex=/grammar=/constraint=none wins)" if lanes else ""
    c.add_argument("--json-schema", metavar="SCHEMA", help="hold the output to a JSON schema (text, or @FILE)" + every)
    c.add_argument("--json-object", action="store_true", help="hold the output to any JSON object" + every)
    c.add_argument("--regex", metavar="RE", help="the whole output matches a regular expression (or @FILE)" + every)
    c.add_argument("--grammar", metavar="GRAMMAR", help="hold the output to a GBNF or Lark grammar (text, or @FILE)" + every)


def _constraint(args):
    from core.engine.constrain import from_argument
    for kind in ("json_schema", "regex", "grammar"):
        if getattr(args, kind, None) is not None:
            return from_argument(kind, getattr(args, kind))
    return from_argument("json_object", "") if getattr(args, "json_object", False) else None


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="python -m core", description="LlamaDesk core: run LLaMA-family models.")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="generate a continuation or a chat reply")
    g.add_argument("model", nargs="?", help="Meta folder, Hugging Face folder or .gguf file (or --server)")
    _add_server_opts(g)
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
    _add_bias_opts(g)
    _add_spec_opts(g)
    _add_constraint_opts(g)
    _add_model_opts(g)

    c = sub.add_parser("compare", help="run one prompt under several sampler settings together")
    c.add_argument("model", nargs="?", help="the lanes' model (or --server, or model=/server= in each lane)")
    _add_server_opts(c)
    _add_prompt_opts(c)
    c.add_argument("--lane", action="append", required=True, metavar="SPEC",
                   help="comma-separated key=value over " + ", ".join((*LANE_KEYS, *BACKEND_KEYS))
                   + " (model=PATH: another local checkpoint; server=URL[,model=NAME]: a model on a server; "
                   "json_schema=@FILE, regex=RE|@FILE, grammar=@FILE, json_object=1 or constraint=none: the lane's "
                   "constraint; logit_bias=TEXT=BIAS, repeatable: the lane's logit bias after --logit-bias's)")
    _add_bias_opts(c)
    _add_spec_opts(c)
    _add_constraint_opts(c, lanes=True)
    _add_model_opts(c)

    s = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    s.add_argument("model", help="Meta folder, Hugging Face folder or .gguf file")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (other than loopback needs --api-key)")
    s.add_argument("--port", type=int, default=8000, help="TCP port (0: any free port)")
    s.add_argument("--api-key", default=os.environ.get("LLAMADESK_API_KEY"),
                   help="clients must send 'Authorization: Bearer KEY' (default: $LLAMADESK_API_KEY)")
    s.add_argument("--max-batch", type=int, default=16, help="most sequences decoded together")
    s.add_argument("--max-queue", type=int, default=64, help="most requests waiting; more get 503")
    s.add_argument("--model-name", default=None, help="the model id clients use (default: the folder or file name)")
    s.add_argument("--lookup", type=int, default=0, metavar="N",
                   help="requests draft by prompt lookup over the last N tokens (1-8) unless they say otherwise "
                        "(request field lookup; same output, faster when replies repeat their prompt)")
    s.add_argument("--draft", default=None, metavar="MODEL",
                   help="load a smaller draft MODEL of the same vocabulary; requests draft with it unless they say "
                        "otherwise (request field draft: true, false or its name)")
    _add_model_opts(s)

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
    i.add_argument("--quality", action="store_true",
                   help="add perplexity on a held-out text and greedy agreement over 256 tokens against float32")

    try:
        from core.checkpoints.convert import add_convert_parser
    except ImportError:
        pass
    else:
        add_convert_parser(sub)
    from core.cli.library import add_library_parsers
    add_library_parsers(sub)
    return ap


def _load(args):
    from core.checkpoints import load
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
    from core.prompt.chat_format import chat_format_for
    tok = loaded.tokenizer
    if args.chat:
        fmt = loaded.chat_format if args.chat_format == "auto" else chat_format_for(tok, override=args.chat_format)
        return fmt.encode_dialog(_messages(args)), bool(getattr(tok, "add_dummy_prefix", False))
    if args.system:
        raise SettingsError("--system needs --chat")
    return tok.encode(args.prompt, bos=True), False


CONSTRAINT_KEYS = ("json_schema", "json_object", "regex", "grammar", "constraint")


def _lane_spec(spec: str, default_max: int | None, spec_defaults: dict | None = None, constraint=None,
               bias: tuple[str, ...] = ()):
    from core.engine.constrain import from_argument
    from core.engine.sampling import SamplingParams
    kw: dict = {"constraint": constraint, "logit_bias_text": tuple(bias)}
    for part in filter(None, (s.strip() for s in spec.split(","))):
        key, eq, val = part.partition("=")
        key = key.strip().replace("-", "_")
        if eq and key in CONSTRAINT_KEYS:
            if key == "constraint" and val.strip() != "none":
                raise SettingsError(f"constraint= takes only 'none' in lane '{spec}': use json_schema=, regex= or grammar=")
            kw["constraint"] = None if key == "constraint" else from_argument(key, val.strip())
            continue
        if not eq or key not in LANE_KEYS:
            raise SettingsError(f"bad lane setting '{part}': use key=value with key one of {', '.join(LANE_KEYS)}")
        if key == "logit_bias":  # after --logit-bias's items, so a lane's own win for the same tokens
            kw["logit_bias_text"] = (*kw.get("logit_bias_text", ()), val)
            continue
        if key == "logit_bias_id":
            kw["logit_bias"] = {**kw.get("logit_bias", {}), **_id_bias(val.strip())}
            continue
        try:
            kw[key] = LANE_KEYS[key](val.strip())
        except ValueError:
            raise SettingsError(f"bad value for {key} in lane '{spec}': {val.strip()!r}") from None
    if "max_new_tokens" not in kw and default_max:
        kw["max_new_tokens"] = default_max
    if spec_defaults and not any(k in kw for k in SPEC_KEYS):
        kw.update(spec_defaults)
    return SamplingParams(**kw).validate()


def _id_bias(spec: str) -> dict[int, float]:
    """A lane's ``logit_bias_id=ID=BIAS`` as {ID: BIAS}."""
    from core.engine.sampling import parse_logit_bias

    def one_id(text: str) -> list[int]:
        try:
            return [int(text.strip())]
        except ValueError:
            raise SettingsError(f"bad logit bias by id {spec!r}: {text.strip()!r} is not a token id (use ID=BIAS)") from None
    return parse_logit_bias(spec, one_id)


def _remote(url: str, args, model: str | None = None):
    from core.remote.client import RemoteModel
    r = RemoteModel(url, api_key=args.api_key, model=model)
    t0 = time.perf_counter()
    r.connect()
    return r, time.perf_counter() - t0


def _check_remote_opts(args) -> None:
    if args.model is not None:
        raise SettingsError("give MODEL or --server, not both")
    for opt, val, default in (("--device", args.device, "auto"), ("--dtype", args.dtype, "auto"),
                              ("--chat-format", args.chat_format, "auto")):
        if val != default:
            raise SettingsError(f"{opt} applies to local models; the server chooses its own")
    if args.system and not args.chat:
        raise SettingsError("--system needs --chat")


def _remote_stream(remote, args, params, lane: int = 0, meta: dict | None = None):
    """One reply from a server: a chat reply with --chat, else a completion."""
    if args.chat:
        return remote.stream(params, messages=_messages(args), lane=lane, meta=meta)
    return remote.stream(params, prompt=args.prompt, lane=lane, meta=meta)


def cmd_generate(args) -> int:
    from core.engine.engine import Done, Token
    from core.engine.sampling import SamplingParams
    params = SamplingParams(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
        repetition_penalty=args.repetition_penalty, seed=args.seed,
        max_new_tokens=args.max_new_tokens or 256, stop=tuple(args.stop),
        num_beams=args.num_beams, length_penalty=args.length_penalty,
        lookup=args.lookup, draft=args.draft or "", constraint=_constraint(args)).validate().resolved()
    _check_bias(args)
    meta: dict = {}
    extra: dict = {}
    if args.server:
        _check_remote_opts(args)
        if params.speculative:
            raise SettingsError("--lookup and --draft need a local model: the server decodes on its own")
        if params.num_beams > 1:
            raise SettingsError("--num-beams needs a local model: OpenAI-compatible servers do not run beam search")
        remote, load_s = _remote(args.server, args, args.remote_model)
        events = _remote_stream(remote, args, params, meta=meta)
        extra = {"model": remote.model, "server": remote.url}
    else:
        if args.model is None:
            raise SettingsError("give a MODEL (a folder or .gguf file) or --server URL")
        loaded, load_s = _load(args)
        ids, strip = _prompt_ids(loaded, args)
        if args.logit_bias:
            params = replace(params, logit_bias=_logit_bias(args, loaded.tokenizer)).validate()
        engine = _engine(loaded, args)
        engine.draft_loader = _app_draft_loader(engine)
        events = engine.generate(ids, params, strip_leading_space=strip)
        meta["prompt_token_ids"] = ids
    done = None
    for ev in events:
        if isinstance(ev, Token) and not args.json and ev.text:
            sys.stdout.write(ev.text)
            sys.stdout.flush()
        elif isinstance(ev, Done):
            done = ev
    if args.json:
        st = done.stats
        print(json.dumps({
            "text": done.text, "prompt_tokens": meta.get("prompt_token_ids"), "tokens": done.tokens,
            "logprobs": done.logprobs, "stop_reason": done.stop_reason, "seed": params.seed,
            "timings": {"load_s": load_s, "prefill_s": st.prefill_s, "decode_s": st.decode_s,
                        "prefill_tok_s": st.prefill_tok_s, "decode_tok_s": st.decode_tok_s,
                        **({"warmup_s": st.warmup_s} if st.warmup_s else {})},
            **({"decode": st.decode} if st.decode else {}),
            **({"speculative": st.speculative} if st.speculative else {}),
            **({"error": done.error} if done.error else {}),
            **extra,
        }, ensure_ascii=False))
    else:
        sys.stdout.write("\n")
    return _ended_in_error([done])


def _split_lane(spec: str) -> tuple[str, dict]:
    """(the sampler part of a lane spec, its backend keys model= and server=)."""
    rest, backend = [], {}
    for part in spec.split(","):
        key, eq, val = part.strip().partition("=")
        if eq and key.strip() in BACKEND_KEYS:
            backend[key.strip()] = val.strip()
        else:
            rest.append(part)
    return ",".join(rest), backend


def _lane_backend(backend: dict, args) -> tuple[str | None, str | None]:
    """(server URL or None, model): where a lane runs."""
    if "server" in backend:
        return backend["server"], backend.get("model")
    if "model" in backend:
        if Path(backend["model"]).expanduser().exists() or not args.server:
            return None, backend["model"]
        return args.server, backend["model"]  # a model on the default server
    if args.server:
        return args.server, args.remote_model
    if args.model is None:
        raise SettingsError("give a MODEL, --server URL, or model=/server= in every lane")
    return None, args.model


def cmd_compare(args) -> int:
    """Lanes on the same local model decode together over one prefill; lanes on other
    local checkpoints run per checkpoint; lanes on servers run as parallel requests."""
    from concurrent.futures import ThreadPoolExecutor

    from core.engine.engine import Done, Prefilled
    from core.engine.lanes import tokenizer_fingerprint
    if args.server and args.model is not None:
        raise SettingsError("give MODEL or --server, not both")
    specs = [_split_lane(s) for s in args.lane]
    spec_defaults = {"lookup": args.lookup, "draft": args.draft or ""}
    every = _constraint(args)
    _check_bias(args)
    # --logit-bias and a lane's logit_bias= items stay text: each lane's engine splits them
    # with its own checkpoint's tokenizer (Engine.check_request).
    lanes = [_lane_spec(sp, args.max_new_tokens, spec_defaults, every, tuple(args.logit_bias)).resolved()
             for sp, _ in specs]
    if len(lanes) > 8:
        raise SettingsError(f"at most 8 lanes, got {len(lanes)}")
    where = [_lane_backend(b, args) for _, b in specs]
    if args.system and not args.chat:
        raise SettingsError("--system needs --chat")
    load_s = local_load = 0.0
    remotes: dict[tuple, object] = {}
    for server, model in dict.fromkeys(w for w in where if w[0] is not None):
        remotes[(server, model)], took = _remote(server, args, model)
        load_s += took
    for i, (q, w) in enumerate(zip(lanes, where)):
        # LlamaDesk's serve takes these (its own tokenizer splits a bias's TEXT; ids are its own);
        # other servers do not: say so before any lane runs.
        asked = [what for what, on in (("lookup", q.lookup), ("draft", q.draft), ("a logit bias by text", q.logit_bias_text))
                 if on]
        if asked and w[0] is not None and not remotes[w].is_llamadesk:
            raise SettingsError(f"lane {i + 1}: {' and '.join(asked)} runs on a local model or LlamaDesk's serve "
                                f"only, and {remotes[w].url} is another server")
    t0 = time.perf_counter()
    results: dict[int, Done] = {}
    prompt_ids: dict[int, list[int] | None] = {}
    fingerprints: dict[int, str | None] = {}
    names: dict[int, tuple[str, str | None]] = {}
    prefill_s = 0.0

    def run_remote(i: int) -> Done:
        meta: dict = {}
        done = [e for e in _remote_stream(remotes[where[i]], args, lanes[i], lane=i, meta=meta) if isinstance(e, Done)][0]
        prompt_ids[i] = meta.get("prompt_token_ids")
        return done

    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = {i: pool.submit(run_remote, i) for i, w in enumerate(where) if w[0] is not None}
        for i, w in enumerate(where):
            if w[0] is not None:
                r = remotes[w]
                fingerprints[i], names[i] = r.tokenizer_fingerprint, (r.model, r.url)
        local_paths = list(dict.fromkeys(m for s, m in where if s is None))
        for path in local_paths:
            idx = [i for i, w in enumerate(where) if w == (None, path)]
            args.model = path
            loaded, took = _load(args)
            load_s += took
            local_load += took
            ids, strip = _prompt_ids(loaded, args)
            engine = _engine(loaded, args)
            engine.draft_loader = _app_draft_loader(engine)
            fp = tokenizer_fingerprint(loaded.tokenizer, loaded.model.args.vocab_size)
            for ev in engine.generate_lanes(ids, [lanes[i] for i in idx], strip_leading_space=strip):
                if isinstance(ev, Done):
                    i = idx[ev.lane]
                    ev.lane = i
                    results[i] = ev
                elif isinstance(ev, Prefilled) and path == local_paths[0]:
                    prefill_s = ev.seconds
            for i in idx:
                prompt_ids[i], fingerprints[i], names[i] = ids, fp, (loaded.name, None)
        for i, f in futures.items():
            results[i] = f.result()
    total = time.perf_counter() - t0 - local_load
    out = [results[i] for i in range(len(lanes))]
    known = {fingerprints[i] for i in range(len(lanes))}
    match = None if None in known else len(known) == 1
    if args.json:
        print(json.dumps({
            "prompt_tokens": prompt_ids[0],
            "lanes": [{"settings": d.params.to_dict(), "text": d.text, "tokens": d.tokens, "logprobs": d.logprobs,
                       "stop_reason": d.stop_reason, "stats": d.stats.to_dict(), "model": names[i][0],
                       "server": names[i][1], **({"error": d.error} if d.error else {})} for i, d in enumerate(out)],
            "tokenizers_match": match,
            "timings": {"load_s": load_s, "prefill_s": prefill_s, "decode_s": total - prefill_s, "total_s": total},
        }, ensure_ascii=False))
        return _ended_in_error(out)
    for i, d in enumerate(out):
        p = d.params
        on = names[i][0] + (f" on {names[i][1]}" if names[i][1] else "")
        print(f"── lane {i + 1}: {on} · temperature={p.temperature} top_p={p.top_p} top_k={p.top_k} "
              f"min_p={p.min_p} repetition_penalty={p.repetition_penalty} seed={p.seed} "
              + (f"· {p.constraint.describe()} " if p.constraint is not None else "")
              + (f"· logit bias {', '.join(p.logit_bias_text)} " if p.logit_bias_text else "")
              + f"· {len(d.tokens)} tokens · {d.stop_reason}{_spec_note(d.stats)}")
        print(d.text)
        print()
    if match is not True:
        print("note: " + ("the lanes' tokenizers differ" if match is False else "a server does not say its tokenizer")
              + ": compare their texts, not their token ids", file=sys.stderr)
    return _ended_in_error(out)


def _ended_in_error(dones) -> int:
    """2 and one line on stderr when a reply (the first such lane) stopped on an error
    mid-reply (its output format went past the grammar engine's limits, NaN logits);
    what it generated before is printed already."""
    for i, d in enumerate(dones):
        if d.stop_reason == "error":
            where = f"lane {i + 1}: " if len(dones) > 1 else ""
            print(f"error: {where}{d.error or 'the reply stopped on an error'}", file=sys.stderr)
            return 2
    return 0


def _spec_note(stats) -> str:
    sp = getattr(stats, "speculative", None) if stats is not None else None
    if not sp:
        return ""
    how = f"lookup {sp['lookup']}" if sp["kind"] == "lookup" else f"draft {Path(sp['draft']).name}"
    return f" · {how}: {sp['accepted']}/{sp['drafted']} drafted tokens accepted"


def cmd_tokenize(args) -> int:
    from core.prompt.chat_format import chat_format_for
    path = Path(args.model).expanduser()
    if not path.exists():
        raise SettingsError(f"no such file or folder: {path}")
    from core import limits
    # Only the magic is read: the file may be a multi-GB GGUF (or a FIFO, refused).
    if path.is_dir() or limits.read_head(path, 4, error=SettingsError) == b"GGUF":
        from core.checkpoints import load
        loaded = load(path, device="cpu", dtype="float32")
        tok, fmt = loaded.tokenizer, loaded.chat_format
    else:
        from core.tokenizer import load_tokenizer
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


def cmd_serve(args) -> int:
    from core.serving.run import is_loopback, serve_forever
    from core.serving.state import ServerState
    if not is_loopback(args.host) and not args.api_key:
        raise SettingsError(f"--host {args.host} lets other machines connect: it needs --api-key "
                            "(or LLAMADESK_API_KEY); without one, serve on 127.0.0.1")
    if not 0 <= args.port <= 65535:
        raise SettingsError(f"--port must be 0 to 65535, got {args.port}")
    if not 1 <= args.max_batch <= 256:
        raise SettingsError(f"--max-batch must be 1 to 256, got {args.max_batch}")
    if args.max_queue < 0:
        raise SettingsError(f"--max-queue must be 0 or more, got {args.max_queue}")
    from core.engine.sampling import MAX_LOOKUP
    if not 0 <= args.lookup <= MAX_LOOKUP:
        raise SettingsError(f"--lookup must be a whole number from 0 (off) to {MAX_LOOKUP}, got {args.lookup}")
    if args.lookup and args.draft:
        raise SettingsError("choose --lookup or --draft, not both")
    loaded, load_s = _load(args)
    state = ServerState(loaded, model_id=args.model_name, api_key=args.api_key,
                        max_batch=args.max_batch, max_queue=args.max_queue, lookup=args.lookup, draft=args.draft,
                        compile=args.compile)

    def announce(url: str) -> None:
        print(f"serving {state.model_id} at {url} (loaded in {load_s:.1f} s; Ctrl+C stops)", file=sys.stderr, flush=True)

    serve_forever(state, args.host, args.port, announce)
    return 0


def _threads(loaded):
    """(prefill, decode) threads for the CLI's engine and why: LLAMADESK_THREADS if set,
    else the CPU probe's pick per phase over every core (the CLI owns the machine)."""
    from core.model.tuning import plan_for
    from core.worker.worker import THREADS_ENV, resolve_torch_threads
    override = resolve_torch_threads() if os.environ.get(THREADS_ENV, "").strip() else None
    return plan_for(loaded.model.tok_embeddings.weight.device, os.cpu_count() or 1, override)


def _engine(loaded, args):
    from core.engine.engine import Engine
    plan = _threads(loaded)
    return Engine(loaded.model, loaded.tokenizer, stop_ids=loaded.stop_ids, compile=getattr(args, "compile", False),
                  threads=(plan.prefill, plan.decode) if plan else None)


def cmd_info(args) -> int:
    from core import limits
    loaded, load_s = _load(args)
    info = dict(loaded.info)
    info["load_s"] = round(load_s, 3)
    plan = _threads(loaded)
    if plan is not None:
        info["threads"] = plan.reason
    info["decode"] = _engine(loaded, args).compile_status  # "compiles at the first decode step (...)" with --compile
    if args.quality:
        from core.checkpoints.quality import compare
        from core.checkpoints import load
        reference = load(args.model, device=args.device, dtype="float32")
        info["quality"] = compare(loaded.model, reference.model, loaded.tokenizer)
    path = Path(args.model).expanduser()
    links = limits.symlinks_in([path] + (sorted(path.iterdir()) if path.is_dir() else []))
    if links:  # followed, but said: the files read are not where they seem to be
        info["symlinks"] = links
    from core.cli.library import write_stdout
    write_stdout(json.dumps(info, ensure_ascii=False, default=str) + "\n")  # a non-UTF-8 name as its bytes
    return 0


def _valid_arguments(args) -> None:
    """Text arguments that were not valid UTF-8 (lone surrogates after Python's decoding)
    get U+FFFD in place of the bad bytes, with a warning."""
    from core.tokenizer.base import valid_text
    for name in ("prompt", "system", "text"):
        v = getattr(args, name, None)
        if isinstance(v, str):
            fixed = valid_text(v)
            if fixed != v:
                setattr(args, name, fixed)
                print(f"warning: --{name} was not valid UTF-8; the bad bytes were replaced with U+FFFD",
                      file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.cmd in ("generate", "compare") and args.max_new_tokens is not None and args.max_new_tokens < 1:
            raise SettingsError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
        if getattr(args, "draft", None) is not None and not args.draft.strip():
            raise SettingsError("--draft needs a draft model's path (a .gguf file or a model folder)")
        _valid_arguments(args)
        import torch
        torch.set_num_threads(os.cpu_count() or 1)  # the CLI owns the machine
        from core.cli.library import cmd_models, cmd_pull
        handler = {"generate": cmd_generate, "compare": cmd_compare, "tokenize": cmd_tokenize,
                   "info": cmd_info, "serve": cmd_serve, "pull": cmd_pull, "models": cmd_models}.get(args.cmd)
        if handler is None:
            from core.checkpoints.convert import run_convert
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
    except RuntimeError as e:  # torch's allocator reports running out of memory this way
        if "memory" not in str(e).lower():
            raise
        print("error: out of memory while loading or running the model", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e.strerror or e}: {e.filename or ''}".rstrip(": "), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
