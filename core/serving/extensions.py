"""The fields clients written for vLLM and llama.cpp's server send beside OpenAI's.

Three kinds: another server's name for a field this one has (llama.cpp's ``repeat_penalty``
and ``n_predict``), what this server does beyond OpenAI (vLLM's ``min_tokens``,
``ignore_eos``, ``include_stop_str_in_output``, ``continue_final_message``,
``add_generation_prompt``), and the samplers it does not have (``typical_p``,
``mirostat``, ``n_probs``, ``prompt_logprobs`` ...), refused with a 400 naming the field
unless left at the value that turns them off. The constraint fields (vLLM's ``guided_*``
and ``structured_outputs``) are :func:`core.serving.protocol.constraint_from_request`'s.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from core.engine.settings import SamplingParams
from core.prompt.prompting import render_chat
from core.serving.protocol import APIError

# Another server's name -> this server's field.
ALIASES = {"repeat_penalty": "repetition_penalty", "n_predict": "max_tokens"}
# Samplers and outputs this server does not have: refused unless at a value that is off.
REFUSED = {"typical_p": (1, 1.0), "tfs_z": (1, 1.0), "mirostat": (0,), "n_probs": (0,),
           "prompt_logprobs": (), "top_n_sigma": (-1, -1.0), "xtc_probability": (0, 0.0),
           "dry_multiplier": (0, 0.0), "dynatemp_range": (0, 0.0), "use_beam_search": (False,),
           "length_penalty": (1, 1.0), "bad_words": ([],), "allowed_token_ids": (),
           "truncate_prompt_tokens": (), "skip_special_tokens": (True,), "spaces_between_special_tokens": (True,),
           "guided_decoding_backend": (), "guided_whitespace_pattern": (), "logits_processors": ([],)}
# Settings of a sampler that is off: harmless whatever their value while their switch is
# off (llama.cpp's web UI sends mirostat_tau with mirostat 0), refused once it is on.
MOOT = {"mirostat_tau": "mirostat", "mirostat_eta": "mirostat", "xtc_threshold": "xtc_probability",
        "dry_base": "dry_multiplier", "dry_allowed_length": "dry_multiplier", "dry_penalty_last_n": "dry_multiplier",
        "dry_sequence_breakers": "dry_multiplier", "dynatemp_exponent": "dynatemp_range",
        "repeat_last_n": "repetition_penalty", "penalty_last_n": "repetition_penalty"}
FLAGS = ("ignore_eos", "include_stop_str_in_output", "continue_final_message", "add_generation_prompt")


@dataclass
class Extras:
    """What a request asks beyond OpenAI's fields (the rest reach the sampler's settings)."""
    ignore_eos: bool = False  # generate past the model's end of text / end of turn
    include_stop_str: bool = False  # the stop string that ended a choice stays in its text
    min_tokens: int = 0
    continue_final: bool = False  # the last (assistant) message is continued, not answered
    generation_prompt: bool = True  # the assistant's header follows the messages
    unbounded: bool = False  # llama.cpp's n_predict -1: up to the context
    renamed: dict = field(default_factory=dict)  # this server's field -> the alias the request used

    def named(self, e: APIError) -> APIError:
        """``e`` naming the field as the request did (n_predict, not max_tokens)."""
        alias = self.renamed.get(e.param)
        if alias is None:
            return e
        return APIError(e.status, str(e).replace(e.param, alias), param=alias, code=e.code, type=e.type)


def read_extensions(body: dict) -> tuple[dict, Extras]:
    """(the body with aliases under this server's names, the extras it asks for);
    APIError 400 naming a field this server refuses or a malformed one."""
    for key, off in REFUSED.items():
        if body.get(key) is not None and body[key] not in off:
            raise APIError(400, f"{key} is not supported by this server", param=key)
    for key, switch in MOOT.items():
        if switch == "repetition_penalty":
            on = any(body.get(k) not in (None, 1, 1.0) for k in (switch, "repeat_penalty"))
        else:
            on = body.get(switch) not in (None, 0, 0.0)
        if key in body and body[key] is not None and on and not (key.endswith("last_n") and body[key] == -1):
            raise APIError(400, f"{key} is not supported by this server", param=key)
    out, ex = dict(body), Extras()
    for alias, name in ALIASES.items():
        if out.get(alias) is None:
            continue
        if out.get(name) is not None and out[name] != out[alias]:
            raise APIError(400, f"{alias} and {name} say different things: give one", param=alias)
        value = out.pop(alias)
        if alias == "n_predict" and value == -1:  # llama.cpp: no limit but the context
            ex.unbounded = True
            continue
        out[name], ex.renamed[name] = value, alias
    for key in FLAGS:
        if out.get(key) is not None and not isinstance(out[key], bool):
            raise APIError(400, f"{key} must be true or false", param=key)
    ex.ignore_eos, ex.include_stop_str = bool(out.get("ignore_eos")), bool(out.get("include_stop_str_in_output"))
    ex.continue_final = bool(out.get("continue_final_message"))
    ex.generation_prompt = out.get("add_generation_prompt") is not False
    if ex.continue_final and out.get("add_generation_prompt") is True:
        raise APIError(400, "continue_final_message continues the last message: it takes add_generation_prompt "
                       "false", param="continue_final_message")
    mt = out.get("min_tokens")
    if mt is not None and (isinstance(mt, bool) or not isinstance(mt, int) or mt < 0):
        raise APIError(400, f"min_tokens must be a whole number ≥ 0, got {json.dumps(mt)[:40]}", param="min_tokens")
    ex.min_tokens = mt or 0
    return out, ex


def with_min_tokens(ex: Extras, body: dict, lanes: list[SamplingParams]) -> list[SamplingParams]:
    """The lanes for a request with min_tokens: at most max_tokens (vLLM's rule), and not
    drafting (a verification draws tokens the min_tokens mask does not reach): the
    server's default lookup or draft is left off; asked for in the request, it is a 400."""
    if not ex.min_tokens:
        return lanes
    if ex.min_tokens > lanes[0].max_new_tokens:
        raise APIError(400, f"min_tokens ({ex.min_tokens}) must be at most max_tokens ({lanes[0].max_new_tokens})",
                       param="min_tokens")
    if any(body.get(k) not in (None, 0, False, "") for k in ("lookup", "draft")):
        raise APIError(400, "min_tokens does not combine with lookup or draft", param="min_tokens")
    return [replace(q, lookup=0, draft="") for q in lanes]


def render_messages(chat_format, msgs: list[dict], ex: Extras, tools: tuple = ()) -> list[int]:
    """The prompt for ``msgs`` (and the ``tools`` it declares): ready for the assistant's
    reply (OpenAI), the last message carried on (vLLM's continue_final_message), or the
    messages alone (add_generation_prompt false)."""
    if ex.continue_final:
        if msgs[-1]["role"] != "assistant" or msgs[-1].get("tool_calls"):
            raise APIError(400, "continue_final_message continues the last message: it must be the assistant's "
                           "text", param="messages")
        if not msgs[-1]["content"]:
            return render_chat(chat_format, msgs[:-1], tools=tools)
        return render_chat(chat_format, msgs[:-1], continue_reply=msgs[-1]["content"], tools=tools)
    if not ex.generation_prompt:
        return chat_format.encode_dialog(msgs, add_generation_prompt=False, tools=tools)
    return render_chat(chat_format, msgs, tools=tools)
