"""Tool calls valid by construction: the share of valid calls with the engine's call
constraint on and off, and what the constraint costs per call.

The demo model (assets/models/llamadesk-demo, a 1.6M-parameter story model) is not trained
for tools, which is the point: it stands in for a small model that does not know a tool's
schema. Each sampled call is steered into calling by tool_choice = that tool's name (the
call's opening, up to ``"parameters": ``, is forced with the constraint off as with it
on); on, the arguments are held to the tool's schema; off, the model writes them alone.
A call is valid when the reply parses as one call to the named tool whose arguments fit
its schema (jsonschema), and it ended on its own (not cut by max tokens).

    python bench/tool_validity.py [--quick]     (or through bench/bench_tools.py)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.checkpoints import load  # noqa: E402
from core.engine.constrain import Vocabulary  # noqa: E402
from core.engine.constraint import Constraint  # noqa: E402
from core.engine.engine import Engine  # noqa: E402
from core.engine.events import Done  # noqa: E402
from core.engine.settings import SamplingParams  # noqa: E402
from core.prompt.tool_format import ToolCalling  # noqa: E402
from core.tools.spec import Tool  # noqa: E402

DEMO = ROOT / "assets" / "models" / "llamadesk-demo"
S = {"type": "string"}


def _obj(required: list[str], **props) -> dict:
    return {"type": "object", "required": required, "properties": props}


# Ten schemas of the kinds tools declare: bounded strings, integers in a range, enums,
# numbers, booleans, a pattern, an array, a nested object, optional arguments.
SCHEMAS = [
    Tool("get_weather", "Weather in a city", _obj(["city", "days"], city={**S, "maxLength": 12},
                                                  days={"type": "integer", "minimum": 1, "maximum": 7})),
    Tool("add", "Add two integers", _obj(["a", "b"], a={"type": "integer"}, b={"type": "integer"})),
    Tool("search", "Search the web", _obj(["query"], query={**S, "minLength": 1, "maxLength": 20},
                                          limit={"type": "integer", "minimum": 1, "maximum": 10})),
    Tool("set_alarm", "Set an alarm", _obj(["time"], time={**S, "pattern": "^[0-2][0-9]:[0-5][0-9]$"},
                                           label={**S, "maxLength": 10})),
    Tool("convert", "Convert units", _obj(["value", "unit_from", "unit_to"], value={"type": "number"},
                                          unit_from={"enum": ["m", "km", "mi"]}, unit_to={"enum": ["m", "km", "mi"]})),
    Tool("toggle_light", "Switch a light", _obj(["room", "on"], room={"enum": ["kitchen", "hall", "bedroom"]},
                                                on={"type": "boolean"})),
    Tool("get_stock", "A share's price", _obj(["symbol"], symbol={**S, "pattern": "^[A-Z]{1,5}$"})),
    Tool("invite", "Invite people", _obj(["names"], names={"type": "array", "items": {**S, "maxLength": 8},
                                                            "minItems": 1, "maxItems": 3})),
    Tool("book_table", "Book a table", _obj(["party", "when"], party={"type": "integer", "minimum": 1, "maximum": 12},
                                            when=_obj(["day", "hour"], day={"enum": ["mon", "tue", "wed"]},
                                                      hour={"type": "integer", "minimum": 9, "maximum": 22}))),
    Tool("note", "Write a note", _obj(["text"], text={**S, "maxLength": 24}, pinned={"type": "boolean"})),
]
QUESTION = [{"role": "user", "content": "Please use a tool to help me with my day."}]


def valid(d: Done, tool: Tool) -> tuple[bool, str]:
    """(whether the reply is one valid call to ``tool``, why not)."""
    if d.stop_reason != "tool_calls":
        return False, "unfinished" if d.stop_reason == "length" else f"stopped: {d.stop_reason}"
    if len(d.tool_calls) != 1:
        return False, f"{len(d.tool_calls)} calls"
    c = d.tool_calls[0]
    if c.error:
        return False, "not JSON" if "not valid JSON" in c.error else "schema"
    return c.name == tool.name, "" if c.name == tool.name else "wrong tool"


def measure(quick: bool) -> dict:
    # One torch thread: on the shared 2-core machine two OpenMP threads spin against other
    # jobs (a 128-wide linear layer took 55 ms instead of microseconds).
    torch.set_num_threads(1)
    lm = load(DEMO, device="cpu", dtype="float32")
    eng = Engine(lm.model, lm.tokenizer, stop_ids=sorted(lm.stop_ids))
    prompt = lm.chat_format.encode_dialog(QUESTION)  # the demo's 512 positions hold no tool prompt
    calling = ToolCalling(tuple(SCHEMAS), parallel=False, start_token="")
    tools = SCHEMAS[:2] if quick else SCHEMAS
    per_tool = 4 if quick else 20
    out: dict = {"calls": len(tools) * per_tool, "schemas": len(tools), "max_new_tokens": 160}
    t = time.perf_counter()
    eng.vocabulary.lltokenizer()  # built once per model (not a per-call cost)
    out["vocabulary_s"] = time.perf_counter() - t
    for arm, held in (("on", True), ("off", False)):
        ok, why, per_call, per_token = 0, {}, [], []
        for k, tool in enumerate(tools):
            for at in range(0, per_tool, 8):
                lanes = [SamplingParams(temperature=1.0, top_p=1.0, seed=1000 * k + s, max_new_tokens=160,
                                        tool_choice=tool.name, tool_constraint=held)
                         for s in range(at, min(at + 8, per_tool))]
                t = time.perf_counter()
                done = [e for e in eng.generate_lanes(prompt, lanes, tools=calling) if isinstance(e, Done)]
                took = time.perf_counter() - t
                per_call.append(took / len(done))
                per_token.append(took / max(1, sum(len(d.tokens) for d in done)))
                for d in done:
                    good, reason = valid(d, tool)
                    ok += good
                    if not good:
                        why[reason] = why.get(reason, 0) + 1
        out[arm] = {"valid": ok, "share": ok / out["calls"], "invalid": why,
                    "ms_per_call": 1000 * statistics.median(per_call), "ms_per_token": 1000 * statistics.median(per_token)}
    fresh = Vocabulary(lm.tokenizer, lm.model.args.vocab_size)  # nothing compiled in it yet
    fresh.lltokenizer()
    t = time.perf_counter()
    for tool in tools:  # a call grammar is compiled once per tool set and choice, then cached
        fresh.check(Constraint("grammar", calling.grammar(tool.name, True)))
    out["compile_ms_per_tool"] = 1000 * (time.perf_counter() - t) / len(tools)
    out["load_average"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return out


def validity_section(quick: bool) -> dict:
    d = measure(quick)
    on, off = d["on"], d["off"]
    md = ["| call constraint | valid calls | share | invalid, by kind | ms per call | ms per token |",
          "|---|---:|---:|---|---:|---:|"]
    for label, r in (("on (held to the schema)", on), ("off (the model alone)", off)):
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(r["invalid"].items())) or "none"
        md.append(f"| {label} | {r['valid']} / {d['calls']} | {100 * r['share']:.1f}% | {kinds} | "
                  f"{r['ms_per_call']:.1f} | {r['ms_per_token']:.2f} |")
    load = d.get("load_average")
    md += ["", f"{d['calls']} sampled calls (temperature 1) against {d['schemas']} tool schemas on the demo model, "
           f"8 lanes per batch, at most {d['max_new_tokens']} tokens a call. Compiling a new tool set's call grammar: "
           f"{d['compile_ms_per_tool']:.1f} ms per tool (cached after); the vocabulary for the grammar engine: "
           f"{d['vocabulary_s']:.2f} s once per model."
           + (f" Load average {load:.1f} on {os.cpu_count()} cores at the end of the run." if load else "")]
    return {"title": "Tools: valid calls, constraint on vs off", "markdown": "\n".join(md), "data": d}


def run(quick: bool) -> dict:
    """The section for ``python -m bench``."""
    return validity_section(quick)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="16 calls: checks the plumbing")
    section = validity_section(ap.parse_args(argv).quick)
    print(f"### {section['title']}\n\n{section['markdown']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
