"""``python -m core generate``: one continuation or chat reply, from a local model or a server."""
from __future__ import annotations

import json
import sys
from dataclasses import replace

from core.cli.backends import check_remote_opts, connect, engine_for, load_model, prompt_ids, remote_stream
from core.cli.documents import grounded_prompt, say_grounding
from core.cli.common import (beams_json, check_bias, constraint_from_args, ended_in_error, logit_bias_ids,
                             tools_from_args)
from core.cli.tool_rounds import offered, open_toolbox, run_rounds
from core.documents.chunk import model_counter
from core.engine.events import Done
from core.engine.settings import SamplingParams
from core.prompt.tool_format import check_choice
from core.tools.parse import looks_like_call
from core.errors import SettingsError


def params_from_args(args) -> SamplingParams:
    """The sampler settings the flags give, validated and resolved (a seed drawn if none)."""
    return SamplingParams(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
        repetition_penalty=args.repetition_penalty, seed=args.seed,
        max_new_tokens=args.max_new_tokens or 256, stop=tuple(args.stop),
        num_beams=args.num_beams, length_penalty=args.length_penalty,
        lookup=args.lookup, draft=args.draft or "", constraint=constraint_from_args(args),
        tool_choice=getattr(args, "tool_choice", "auto"),
        tool_constraint=getattr(args, "tool_constraint", "on") == "on").validate().resolved()


def cmd_generate(args) -> int:
    params = params_from_args(args)
    check_bias(args)
    box = open_toolbox(args)
    try:
        return _generate(args, params, box)
    finally:
        if box is not None:
            box.close()


def _generate(args, params: SamplingParams, box) -> int:  # long: one reply, local or remote, and its tool rounds
    tools = offered(tools_from_args(args), box)
    if tools:
        check_choice(params.tool_choice, tools)  # a name no tool has: said before any model loads
    parallel = not getattr(args, "no_parallel_tool_calls", False)
    meta: dict = {}
    extra: dict = {}
    if args.server:
        check_remote_opts(args)
        if params.speculative:
            raise SettingsError("--lookup and --draft need a local model: the server decodes on its own")
        if params.num_beams > 1:
            raise SettingsError("--num-beams needs a local model: OpenAI-compatible servers do not run beam search")
        remote, load_s = connect(args.server, args, args.remote_model)
        _ground(args, extra)
        events = remote_stream(remote, args, params, meta=meta, tools=tools, parallel=parallel)

        def again(msgs, p):
            return remote.stream(p, messages=msgs, meta=meta, tools=tools, parallel_tool_calls=parallel)
        extra.update(model=remote.model, server=remote.shown)  # beside the grounding's "documents"
    else:
        if args.model is None:
            raise SettingsError("give a MODEL (a folder or .gguf file) or --server URL")
        loaded, load_s = load_model(args)
        _ground(args, extra, model_counter(loaded), loaded.args.max_seq_len)
        ids, strip, fmt = prompt_ids(loaded, args, tools)
        if args.logit_bias:
            params = replace(params, logit_bias=logit_bias_ids(args, loaded.tokenizer)).validate()
        calling = fmt.tool_calling(tuple(tools), parallel) if tools else None
        engine = engine_for(loaded, args, drafts=True)
        events = engine.generate(ids, params, strip_leading_space=strip, tools=calling)
        meta["prompt_token_ids"] = ids

        def again(msgs, p):  # the next round: the same prompt and its turns since (the cache keeps the prefix)
            meta["prompt_token_ids"] = fmt.encode_dialog(msgs, tools=tuple(tools))
            return engine.generate(meta["prompt_token_ids"], p, strip_leading_space=strip, tools=calling)
    done, ran = run_rounds(events, again, params, box, args)
    if ran:
        extra["tool_rounds"] = ran
    note = cut_call_note(done, tools, params.tool_choice)
    if note:
        extra["note"] = note
    if args.json:
        _print_json(done, params, meta, load_s, extra)
    else:
        sys.stdout.write("\n")
        sys.stdout.flush()  # the reply's line ends before the note, on a terminal showing both
    if note:
        print(f"note: {note}", file=sys.stderr)
    return ended_in_error([done])


def cut_call_note(done: Done | None, tools, choice) -> str:
    """What to say when the reply ran out of room in the middle of a tool call: the engine
    makes no call of a cut one, and a half '{"name": "' with exit 0 said nothing of why."""
    if not tools or done is None or done.stop_reason not in ("length", "context"):
        return ""
    if choice in ("auto", "none", None) and not looks_like_call(done.text):
        return ""
    if done.stop_reason == "length":
        return "the reply reached --max-new-tokens in the middle of a tool call, so no tool was called"
    return ("the model's context filled up in the middle of a tool call, so no tool was called "
            "(the tool definitions take part of it: fewer tools or a shorter prompt)")


def _ground(args, extra: dict, counter=None, context: int | None = None) -> None:
    """--attach/--collection: the prompt becomes the grounded one (its sources on stderr,
    or in the JSON object's "documents")."""
    g = grounded_prompt(args, counter, context)
    if g is None:
        return
    args.prompt = g.prompt
    if args.json:
        extra["documents"] = g.to_meta()
    else:
        say_grounding(g)


def _print_json(done: Done, params: SamplingParams, meta: dict, load_s: float, extra: dict) -> None:
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
        **({"tool_calls": [{**c.to_openai(), **({"error": c.error} if c.error else {})} for c in done.tool_calls]}
           if done.tool_calls else {}),
        **beams_json(done),
        **extra,
    }, ensure_ascii=False))
