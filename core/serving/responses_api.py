"""OpenAI's Responses API (``POST /v1/responses``), which the OpenAI Agents SDK and newer
clients call, served over the chat completions path: a request becomes a chat request
(:func:`chat_body`), the chat reply becomes a Response object (:func:`whole`) and the chat
stream becomes the Responses stream's events (:func:`events`: response.created,
response.output_text.delta ... response.completed).

What it serves: ``input`` (a string or a list of messages, text parts only),
``instructions``, ``max_output_tokens``, ``temperature``, ``top_p``, ``text.format``
(json_object, json_schema) and this server's sampling fields. Stored responses
(``previous_response_id``), tools and reasoning are refused with a 400 naming the field.
"""
from __future__ import annotations

import json
import time
import uuid
from contextlib import aclosing
from typing import AsyncIterator

from core.serving.protocol import APIError

ORIGINAL = "_responses_request"  # the Responses request kept beside the chat body it became
# Responses fields with no chat counterpart, accepted at the value that asks for nothing.
NO_OPS = {"store": (True, False), "truncation": ("disabled", "auto"), "parallel_tool_calls": (True, False),
          "tool_choice": ("none", "auto"), "tools": ([],), "include": ([],), "background": (False,),
          "reasoning": ({},), "previous_response_id": (), "conversation": (), "prompt": ()}
DROPPED = ("input", "instructions", "max_output_tokens", "text", "metadata", "user", "service_tier",
           "prompt_cache_key", "safety_identifier", *NO_OPS)
FINISHED = {"stop": ("completed", None), "length": ("incomplete", {"reason": "max_output_tokens"}),
            "abort": ("incomplete", {"reason": "cancelled"})}


def _text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") in ("input_text", "output_text", "text")
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise APIError(400, f"{where}: only text is supported (a string or input_text parts)", param="input")


def _messages(body: dict) -> list[dict]:
    given = body.get("input")
    msgs = [{"role": "system", "content": body["instructions"]}] if body.get("instructions") else []
    if body.get("instructions") is not None and not isinstance(body["instructions"], str):
        raise APIError(400, "instructions must be a string", param="instructions")
    if isinstance(given, str):
        return msgs + [{"role": "user", "content": given}]
    if not isinstance(given, list) or not given:
        raise APIError(400, "input must be a string or a non-empty list of messages", param="input")
    for i, item in enumerate(given):
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            kind = item.get("type") if isinstance(item, dict) else type(item).__name__
            raise APIError(400, f"input[{i}]: items of type {json.dumps(kind)[:40]} are not supported (messages only)",
                           param="input")
        msgs.append({"role": item.get("role"), "content": _text(item.get("content"), f"input[{i}].content")})
    return msgs


def _format(body: dict) -> dict | None:
    """text.format as chat's response_format (None: plain text)."""
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if text is not None and not isinstance(text, dict):
        raise APIError(400, 'text must be an object such as {"format": {"type": "text"}}', param="text")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is None or kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name", "output"), "schema": fmt.get("schema")}}
    raise APIError(400, 'text.format.type must be "text", "json_object" or "json_schema"', param="text")


def chat_body(body: dict) -> dict:
    """The chat completions body a Responses request asks for (the request itself kept
    under ORIGINAL, to echo); APIError 400 naming what it cannot serve."""
    for key, ok in NO_OPS.items():
        if body.get(key) is not None and body[key] not in ok:
            raise APIError(400, f"{key} is not supported by this server's Responses API", param=key)
    if body.get("n") is not None:
        raise APIError(400, "the Responses API has no n: send one request per reply", param="n")
    out = {k: v for k, v in body.items() if k not in DROPPED}
    out["messages"] = _messages(body)
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    if (rf := _format(body)) is not None:
        out["response_format"] = rf
    out[ORIGINAL] = body
    return out


class Shape:
    """One Responses reply's objects: its ids, the Response as it stands, its events."""

    def __init__(self, body: dict, model: str):
        self.request, self.model = body[ORIGINAL], model
        self.id, self.msg = "resp_" + uuid.uuid4().hex, "msg_" + uuid.uuid4().hex
        self.created, self.seq = int(time.time()), 0

    def response(self, status: str, text: str | None = None, usage: dict | None = None,
                 incomplete: dict | None = None) -> dict:
        q = self.request
        fmt = (q.get("text") or {}).get("format") if isinstance(q.get("text"), dict) else None
        output = [] if text is None else [self.item("completed", text)]
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status, "error": None,
                "incomplete_details": incomplete, "instructions": q.get("instructions"),
                "max_output_tokens": q.get("max_output_tokens"), "model": self.model, "output": output,
                "parallel_tool_calls": False, "temperature": q.get("temperature", 1.0), "top_p": q.get("top_p", 1.0),
                "tool_choice": "none", "tools": [], "text": {"format": fmt or {"type": "text"}},
                "truncation": "disabled", "usage": usage, "metadata": q.get("metadata") or {}, "store": False}

    def item(self, status: str, text: str | None) -> dict:
        content = [] if text is None else [self.part(text)]
        return {"type": "message", "id": self.msg, "status": status, "role": "assistant", "content": content}

    @staticmethod
    def part(text: str) -> dict:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def event(self, kind: str, **fields) -> dict:
        self.seq += 1
        return {"event": kind, "data": json.dumps({"type": kind, "sequence_number": self.seq - 1, **fields})}


def usage(chat_usage: dict) -> dict:
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"input_tokens": chat_usage["prompt_tokens"], "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": chat_usage["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": chat_usage["total_tokens"]}


def whole(chat: dict, body: dict, model: str) -> dict:
    """The Response object of a finished chat completion."""
    choice = chat["choices"][0]
    status, incomplete = FINISHED[choice["finish_reason"]]
    return Shape(body, model).response(status, choice["message"]["content"], usage(chat["usage"]), incomplete)


async def events(chat_batches: AsyncIterator[list[str]], body: dict, model: str) -> AsyncIterator[list[dict]]:
    """The Responses stream's events from a chat stream's batches (its chunks' JSON texts,
    usage included, one list per wake-up), in lists: one per batch, written together."""
    s, text, end = Shape(body, model), [], {"finish": None, "usage": None}
    yield [s.event("response.created", response=s.response("in_progress")),
           s.event("response.in_progress", response=s.response("in_progress")),
           s.event("response.output_item.added", output_index=0, item=s.item("in_progress", None)),
           s.event("response.content_part.added", item_id=s.msg, output_index=0, content_index=0, part=s.part(""))]
    async with aclosing(chat_batches):  # closed with this stream: the chat stream's job is cancelled
        async for batch in chat_batches:
            out = []
            for data in batch:
                if data == "[DONE]":
                    yield out + _finished(s, "".join(text), end)
                    return
                if (ev := _delta(s, json.loads(data), text, end)) is not None:
                    out.append(ev)
                    if ev["event"] == "error":  # what streamed stays; the error ends the response
                        yield out
                        return
            yield out
    yield _finished(s, "".join(text), end)


def _delta(s: Shape, obj: dict, text: list[str], end: dict) -> dict | None:
    """The event one chat chunk makes (None for usage or a chunk with no text); its
    finish reason and usage are kept in ``end``."""
    if "error" in obj:
        err = obj["error"]
        return s.event("error", code=err.get("code"), message=err.get("message"), param=err.get("param"))
    if obj.get("usage") and not obj.get("choices"):
        end["usage"] = usage(obj["usage"])
        return None
    c = obj["choices"][0]
    end["finish"] = c.get("finish_reason") or end["finish"]
    if piece := c["delta"].get("content"):
        text.append(piece)
        return s.event("response.output_text.delta", item_id=s.msg, output_index=0, content_index=0, delta=piece,
                       logprobs=[])
    return None


def _finished(s: Shape, full: str, end: dict) -> list[dict]:
    status, incomplete = FINISHED.get(end["finish"], ("incomplete", {"reason": "cancelled"}))
    done = "response.completed" if status == "completed" else "response.incomplete"
    return [s.event("response.output_text.done", item_id=s.msg, output_index=0, content_index=0, text=full,
                    logprobs=[]),
            s.event("response.content_part.done", item_id=s.msg, output_index=0, content_index=0, part=s.part(full)),
            s.event("response.output_item.done", output_index=0, item=s.item("completed", full)),
            s.event(done, response=s.response(status, full, end["usage"], incomplete))]
