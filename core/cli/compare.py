"""``python -m core compare``: one prompt under several sampler settings together.

Lanes on the same local model decode together over one prefill; lanes on other local
checkpoints run per checkpoint; lanes on servers run as parallel requests.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from core.cli.backends import connect, engine_for, load_model, prompt_ids, remote_stream
from core.cli.common import (BACKEND_KEYS, SPEC_KEYS, beams_json, check_bias, constraint_from_args,
                             ended_in_error, spec_note)
from core.engine.events import Done, Prefilled
from core.engine.lanes import parse_lane_spec
from core.engine.settings import SamplingParams
from core.errors import SettingsError
from core.remote.client import RemoteError
from core.remote.runner import ONE_AT_A_TIME, SERIAL
from core.tokenizer.fingerprint import tokenizer_fingerprint

MAX_LANES = 8


# -- lane specs -------------------------------------------------------------------------


def lane_spec(spec: str, default_max: int | None, spec_defaults: dict | None = None, constraint=None,
              bias: tuple[str, ...] = ()) -> SamplingParams:
    """A lane's ``key=value,...`` (:func:`core.engine.lanes.parse_lane_spec`) as validated
    settings over the command's defaults: its token limit, speculation and constraint, and
    its --logit-bias items (a lane's own logit_bias= items come after, so they win)."""
    own = parse_lane_spec(spec)
    kw = {"constraint": constraint, **own, "logit_bias_text": (*bias, *own.get("logit_bias_text", ()))}
    if "max_new_tokens" not in kw and default_max:
        kw["max_new_tokens"] = default_max
    if spec_defaults and not any(k in own for k in SPEC_KEYS):
        kw.update(spec_defaults)
    return SamplingParams(**kw).validate()


def split_lane(spec: str) -> tuple[str, dict]:
    """(the sampler part of a lane spec, its backend keys model= and server=)."""
    rest, backend = [], {}
    for part in spec.split(","):
        key, eq, val = part.strip().partition("=")
        if eq and key.strip() in BACKEND_KEYS:
            backend[key.strip()] = val.strip()
        else:
            rest.append(part)
    return ",".join(rest), backend


def lane_backend(backend: dict, args) -> tuple[str | None, str | None]:
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


def plan_lanes(args) -> tuple[list[SamplingParams], list[tuple[str | None, str | None]]]:
    """(each lane's settings, where each lane runs), refused before anything loads."""
    if args.server and args.model is not None:
        raise SettingsError("give MODEL or --server, not both")
    specs = [split_lane(s) for s in args.lane]
    spec_defaults = {"lookup": args.lookup, "draft": args.draft or ""}
    every = constraint_from_args(args)
    check_bias(args)
    # --logit-bias and a lane's logit_bias= items stay text: each lane's engine splits them
    # with its own checkpoint's tokenizer (Engine.check_request).
    lanes = [lane_spec(sp, args.max_new_tokens, spec_defaults, every, tuple(args.logit_bias)).resolved()
             for sp, _ in specs]
    if len(lanes) > MAX_LANES:
        raise SettingsError(f"at most {MAX_LANES} lanes, got {len(lanes)}")
    where = [lane_backend(b, args) for _, b in specs]
    if args.system and not args.chat:
        raise SettingsError("--system needs --chat")
    return lanes, where


def connect_servers(args, lanes: list[SamplingParams], where: list) -> tuple[dict, float]:
    """({(server, model): connected RemoteModel}, seconds connecting). LlamaDesk's serve
    takes lookup, draft and a bias by text (its own tokenizer splits the TEXT); other
    servers do not: that is said before any lane runs."""
    remotes: dict[tuple, object] = {}
    took_s = 0.0
    for i, (q, w) in enumerate(zip(lanes, where)):
        if q.num_beams > 1 and w[0] is not None:
            raise SettingsError(f"lane {i + 1}: beam search (num_beams) runs on a local model only: "
                                "servers, LlamaDesk's serve too, do not run it")
    for server, model in dict.fromkeys(w for w in where if w[0] is not None):
        remotes[(server, model)], took = connect(server, args, model)
        took_s += took
    for i, (q, w) in enumerate(zip(lanes, where)):
        asked = [what for what, on in (("lookup", q.lookup), ("draft", q.draft), ("a logit bias by text", q.logit_bias_text))
                 if on]
        if asked and w[0] is not None and not remotes[w].is_llamadesk:
            raise SettingsError(f"lane {i + 1}: {' and '.join(asked)} runs on a local model or LlamaDesk's serve "
                                f"only, and {remotes[w].shown} is another server")
    return remotes, took_s


# -- running the lanes ------------------------------------------------------------------


@dataclass
class Outcome:
    """What each lane (by index) gave, and how long the parts took."""
    done: dict[int, Done] = field(default_factory=dict)
    prompt_ids: dict[int, list[int] | None] = field(default_factory=dict)
    fingerprints: dict[int, str | None] = field(default_factory=dict)
    names: dict[int, tuple[str, str | None]] = field(default_factory=dict)  # (model, server or None)
    prefill_s: float = 0.0
    load_s: float = 0.0  # loading local checkpoints, while the servers' lanes ran
    total_s: float = 0.0


def run_lanes(args, lanes: list[SamplingParams], where: list, remotes: dict) -> Outcome:
    out = Outcome()
    t0 = time.perf_counter()

    one_at_a_time: set = set()  # servers that cut a running reply off when the next came
    locks = {w: threading.Lock() for w in where}
    shared = {w for w in where if where.count(w) > 1}
    # Each server's first requests still streaming: a cut lane runs again only once they have
    # all ended, since one that reached the server late would cut the rerun off in turn.
    first_requests = {w: where.count(w) for w in where}
    ended = threading.Condition()

    def first_request(i: int) -> Done:
        try:
            return stream_lane(i)
        finally:
            with ended:
                first_requests[where[i]] -= 1
                ended.notify_all()

    def stream_lane(i: int) -> Done:
        meta: dict = {}
        done = [e for e in remote_stream(remotes[where[i]], args, lanes[i], lane=i, meta=meta) if isinstance(e, Done)][0]
        out.prompt_ids[i] = meta.get("prompt_token_ids")
        return done

    def run_remote(i: int) -> Done:
        w = where[i]
        try:
            return first_request(i)
        except RemoteError as e:
            if not getattr(e, "unfinished", False) or w not in shared:
                raise
        if w not in one_at_a_time:
            one_at_a_time.add(w)
            print(f"note: {remotes[w].shown}: {ONE_AT_A_TIME}; its lanes ran one after another", file=sys.stderr)
        with ended:
            ended.wait_for(lambda: first_requests[w] == 0)
        with locks[w]:  # the lanes it cut off run again, one at a time
            done = stream_lane(i)
        done.stats.decode = SERIAL
        return done

    with ThreadPoolExecutor(max_workers=MAX_LANES) as pool:
        futures = {i: pool.submit(run_remote, i) for i, w in enumerate(where) if w[0] is not None}
        for i, w in enumerate(where):
            if w[0] is not None:
                r = remotes[w]
                out.fingerprints[i], out.names[i] = r.tokenizer_fingerprint, (r.model, r.shown)
        local_paths = list(dict.fromkeys(m for s, m in where if s is None))
        for path in local_paths:
            _run_local(args, path, [i for i, w in enumerate(where) if w == (None, path)], lanes, out,
                       first=path == local_paths[0])
        for i, f in futures.items():
            out.done[i] = f.result()
    out.total_s = time.perf_counter() - t0 - out.load_s
    return out


def _run_local(args, path: str, idx: list[int], lanes: list[SamplingParams], out: Outcome, *, first: bool) -> None:
    """The lanes ``idx`` on the local checkpoint ``path``, decoded together over one prefill."""
    args.model = path
    loaded, took = load_model(args)
    out.load_s += took
    ids, strip, _ = prompt_ids(loaded, args)
    engine = engine_for(loaded, args, drafts=True)
    fp = tokenizer_fingerprint(loaded.tokenizer, loaded.model.args.vocab_size)
    for ev in engine.generate_lanes(ids, [lanes[i] for i in idx], strip_leading_space=strip):
        if isinstance(ev, Done):
            i = idx[ev.lane]
            ev.lane = i
            out.done[i] = ev
        elif isinstance(ev, Prefilled) and first:
            out.prefill_s = ev.seconds
    for i in idx:
        out.prompt_ids[i], out.fingerprints[i], out.names[i] = ids, fp, (loaded.name, None)


def cmd_compare(args) -> int:
    lanes, where = plan_lanes(args)
    remotes, connect_s = connect_servers(args, lanes, where)
    run = run_lanes(args, lanes, where, remotes)
    dones = [run.done[i] for i in range(len(lanes))]
    known = {run.fingerprints[i] for i in range(len(lanes))}
    match = None if None in known else len(known) == 1
    if args.json:
        _print_json(run, dones, match, connect_s + run.load_s)
        return ended_in_error(dones)
    for i, d in enumerate(dones):
        p = d.params
        on = run.names[i][0] + (f" on {run.names[i][1]}" if run.names[i][1] else "")
        how = (f"num_beams={p.num_beams} length_penalty={p.length_penalty} " if p.num_beams > 1 else
               f"temperature={p.temperature} top_p={p.top_p} top_k={p.top_k} "
               f"min_p={p.min_p} repetition_penalty={p.repetition_penalty} seed={p.seed} ")
        print(f"── lane {i + 1}: {on} · {how}"
              + (f"· {p.constraint.describe()} " if p.constraint is not None else "")
              + (f"· logit bias {', '.join(p.logit_bias_text)} " if p.logit_bias_text else "")
              + f"· {len(d.tokens)} tokens · {d.stop_reason}{spec_note(d.stats)}")
        print(d.text)
        print()
    if match is not True:
        print("note: " + ("the lanes' tokenizers differ" if match is False else "a server does not say its tokenizer")
              + ": compare their texts, not their token ids", file=sys.stderr)
    return ended_in_error(dones)


def _print_json(run: Outcome, dones: list[Done], match: bool | None, load_s: float) -> None:
    print(json.dumps({
        "prompt_tokens": run.prompt_ids[0],
        "lanes": [{"settings": d.params.to_dict(), "text": d.text, "tokens": d.tokens, "logprobs": d.logprobs,
                   "stop_reason": d.stop_reason, "stats": d.stats.to_dict(), "model": run.names[i][0],
                   "server": run.names[i][1], **({"error": d.error} if d.error else {}), **beams_json(d)}
                  for i, d in enumerate(dones)],
        "tokenizers_match": match,
        "timings": {"load_s": load_s, "prefill_s": run.prefill_s, "decode_s": run.total_s - run.prefill_s,
                    "total_s": run.total_s},
    }, ensure_ascii=False))
