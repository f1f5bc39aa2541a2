"""The case tables of the bad-input corpus (tools/badinputs.py): every broken input and
what the CLI must do with it, generated from the seeds (tools/badseeds.py).
"""
from __future__ import annotations

import json
import os
import random
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from tools.badseeds import make_seeds, write_gguf


@dataclass
class Case:
    """One input: the CLI arguments and what must happen.

    expect: "error" (must exit 2 with one line), "ok" (must succeed), "either" (a clean
    refusal or a success; only tracebacks, hangs and peaks count), or "same:<name>" (must
    print what the case <name> printed).
    """
    name: str
    category: str
    argv: list[str]
    expect: str = "either"


BAD_VALUES = [0, -1, 1, 3, 10**9, 2**31, 2**40, 1.5, -2.5, 1e308, float("nan"), float("inf"), "x", "", None,
              [], [1, 2], {}, True]
META_FIELDS = ["dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "multiple_of", "ffn_dim_multiplier",
               "norm_eps", "rope_theta", "max_seq_len", "use_scaled_rope", "hidden_dim", "head_dim"]
HF_FIELDS = ["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size",
             "intermediate_size", "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings",
             "tie_word_embeddings", "rope_scaling", "eos_token_id", "model_type"]
GGUF_KEYS = ["llama.block_count", "llama.embedding_length", "llama.feed_forward_length", "llama.attention.head_count",
             "llama.attention.head_count_kv", "llama.context_length", "llama.attention.layer_norm_rms_epsilon",
             "llama.rope.freq_base", "llama.rope.dimension_count", "llama.attention.key_length", "llama.vocab_size",
             "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.model",
             "general.architecture", "llama.rope.scaling.type"]
GGUF_VALUES = [0, 1, 3, 7, 10**9, 2**32 - 1, 2**40, -1, 1.5, -1e-5, 1e38, float("nan"), "x", [1, 2]]
POSITIVE_INT_FIELDS = {"dim", "n_layers", "n_heads", "hidden_size", "num_hidden_layers", "num_attention_heads",
                       "intermediate_size", "llama.block_count", "llama.embedding_length",
                       "llama.feed_forward_length", "llama.attention.head_count"}


def _must_fail(key: str, v) -> bool:
    """Values that can never describe a working model for this key."""
    if key in POSITIVE_INT_FIELDS:
        return not (isinstance(v, int) and not isinstance(v, bool) and v > 0) or v >= 10**9
    if key in ("norm_eps", "rms_norm_eps", "llama.attention.layer_norm_rms_epsilon"):
        return not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 0.5)
    return False


def _json_cases(seeds, out: Path, rng: random.Random) -> list[Case]:
    cases = []
    for kind, fname, fields_ in (("meta", "params.json", META_FIELDS), ("hf", "config.json", HF_FIELDS)):
        base = json.loads((seeds[kind] / fname).read_text())
        for key in fields_:
            for i, v in enumerate(BAD_VALUES):
                d = out / f"{kind}-{fname.split('.')[0]}-{key}-{i}"
                _clone(seeds[kind], d)
                data = dict(base)
                data[key] = v
                _put(d / fname, json.dumps(data).encode())
                cases.append(Case(d.name, f"{fname} field", ["info", str(d), "--device", "cpu"],
                                  "error" if _must_fail(key, v) else "either"))
        # a few fields removed, and not-an-object documents
        for key in fields_[:6]:
            d = out / f"{kind}-{fname.split('.')[0]}-no-{key}"
            _clone(seeds[kind], d)
            data = dict(base)
            data.pop(key, None)
            _put(d / fname, json.dumps(data).encode())
            cases.append(Case(d.name, f"{fname} field", ["info", str(d), "--device", "cpu"]))
        for j, doc in enumerate(["[]", "1", '"x"', "null", "{", "\xff\xfe", "{}" + " " * 10, "[" * 100000 + "]" * 100000,
                                 '{"a":' * 5000 + "1" + "}" * 5000, " " * (5 << 20) + "{}"]):
            d = out / f"{kind}-{fname.split('.')[0]}-doc{j}"
            _clone(seeds[kind], d)
            _put(d / fname, doc.encode("utf-8", "surrogateescape"))
            cases.append(Case(d.name, f"{fname} document", ["info", str(d), "--device", "cpu"], "error"))
    return cases


def _gguf_kv_cases(seeds, out: Path) -> list[Case]:
    cases = []
    for key in GGUF_KEYS:
        for i, v in enumerate(GGUF_VALUES):
            f = out / f"gguf-kv-{key}-{i}.gguf"
            try:
                write_gguf(seeds["gguf"], f, set_kv={key: v})
            except Exception:  # noqa: BLE001 — the writer refuses some combinations itself
                continue
            cases.append(Case(f.name, "gguf metadata", ["info", str(f), "--device", "cpu"],
                              "error" if _must_fail(key, v) else "either"))
    return cases


def _silent_cases(seeds, out: Path) -> list[Case]:
    """Inputs that load 'fine' unless checked: every one must be refused."""
    import numpy as np
    import torch
    from safetensors.torch import load_file, save_file

    cases = []
    import gguf
    r = gguf.GGUFReader(seeds["gguf"])
    names = [t.name for t in r.tensors]
    for i, name in enumerate(names[::4]):
        for j, bad in enumerate((float("nan"), float("inf"), -float("inf"))):
            t = next(t for t in r.tensors if t.name == name)
            arr = np.array(t.data, dtype=np.float32).copy()
            arr.reshape(-1)[(i * 7 + j) % arr.size] = bad
            f = out / f"gguf-nonfinite-{i}-{j}.gguf"
            write_gguf(seeds["gguf"], f, tensors={name: arr})
            cases.append(Case(f.name, "non-finite weights", ["info", str(f), "--device", "cpu"], "error"))
    for i, name in enumerate(names[1::6]):
        f = out / f"gguf-retype-{i}.gguf"
        write_gguf(seeds["gguf"], f, retype={name: "F16"})
        cases.append(Case(f.name, "re-typed tensor", ["info", str(f), "--device", "cpu"], "error"))
        f = out / f"gguf-misaligned-{i}.gguf"
        write_gguf(seeds["gguf"], f, shift={name: 4})
        cases.append(Case(f.name, "misaligned tensor", ["info", str(f), "--device", "cpu"], "error"))
    sd = load_file(seeds["hf"] / "model.safetensors")
    for i, name in enumerate(sorted(sd)[::5]):
        d = out / f"hf-nonfinite-{i}"
        _clone(seeds["hf"], d)
        sd2 = dict(sd)
        t = sd2[name].clone()
        t.view(-1)[i % t.numel()] = float("nan") if i % 2 else float("inf")
        sd2[name] = t
        (d / "model.safetensors").unlink()
        save_file(sd2, d / "model.safetensors", metadata={"format": "pt"})
        cases.append(Case(d.name, "non-finite weights", ["info", str(d), "--device", "cpu"], "error"))
    msd = torch.load(seeds["meta"] / "consolidated.00.pth", weights_only=True)
    for i, name in enumerate(sorted(msd)[::5]):
        d = out / f"meta-nonfinite-{i}"
        _clone(seeds["meta"], d)
        sd2 = {k: v.clone() for k, v in msd.items()}
        sd2[name].view(-1)[0] = float("nan")
        (d / "consolidated.00.pth").unlink()
        torch.save(sd2, d / "consolidated.00.pth")
        cases.append(Case(d.name, "non-finite weights", ["info", str(d), "--device", "cpu"], "error"))
    return cases + _duplicate_key_cases(seeds, out)


def _duplicate_key_cases(seeds, out: Path) -> list[Case]:
    """Duplicate safetensors keys: the header names one tensor twice (different data)."""
    cases = []
    raw = (seeds["hf"] / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    for i, name in enumerate([k for k in sorted(header) if k != "__metadata__"][:8]):
        other = [k for k in sorted(header) if k not in ("__metadata__", name)
                 and header[k]["shape"] == header[name]["shape"]]
        if not other:
            continue
        text = json.dumps(header)
        dup = f', "{name}": {json.dumps(header[other[0]])}'
        new = (text[:-1] + dup + "}").encode()
        new += b" " * (-(len(new)) % 8)
        d = out / f"hf-duplicate-key-{i}"
        _clone(seeds["hf"], d)
        _put(d / "model.safetensors", len(new).to_bytes(8, "little") + new + raw[8 + n:])
        cases.append(Case(d.name, "duplicate safetensors key", ["info", str(d), "--device", "cpu"], "error"))
    return cases


def _byte_cases(seeds, out: Path, rng: random.Random, per_file: int) -> list[Case]:
    """Byte flips, zeroed blocks, truncations and insertions in every file of every seed."""
    files = [("gguf", None), ("meta", "consolidated.00.pth"), ("meta", "params.json"), ("meta", "tokenizer.model"),
             ("hf", "model.safetensors"), ("hf", "config.json"), ("hf", "tokenizer.model"),
             ("hf", "tokenizer_config.json"), ("hf", "generation_config.json")]
    cases = []
    for kind, fname in files:
        src = seeds[kind] if fname is None else seeds[kind] / fname
        data = src.read_bytes()
        for i in range(per_file):
            b = bytearray(data)
            op = i % 5
            if op == 0:  # truncate
                b = b[: rng.randrange(len(b))]
            elif op == 1:  # flip bytes in the first 4 KiB (headers)
                for _ in range(rng.choice((1, 4, 16))):
                    b[rng.randrange(min(len(b), 4096))] = rng.randrange(256)
            elif op == 2:  # flip anywhere
                for _ in range(rng.choice((1, 8, 64))):
                    b[rng.randrange(len(b))] = rng.randrange(256)
            elif op == 3:  # zero or 0xFF a block
                at, n = rng.randrange(len(b)), rng.choice((8, 64, 512))
                b[at: at + n] = bytes([rng.choice((0, 255))]) * len(b[at: at + n])
            else:  # insert junk
                at = rng.randrange(len(b))
                b[at:at] = bytes(rng.randrange(256) for _ in range(rng.choice((1, 7, 100))))
            tag = f"{kind}-{(fname or 'gguf').replace('.', '_')}-bytes{i}"
            if fname is None:
                f = out / f"{tag}.gguf"
                f.write_bytes(bytes(b))
                target = f
            else:
                target = out / tag
                _clone(seeds[kind], target)
                (target / fname).unlink()
                (target / fname).write_bytes(bytes(b))
            cases.append(Case(tag, f"bytes of {fname or 'gguf'}", ["info", str(target), "--device", "cpu"]))
    return cases


def _tokenizer_cases(seeds, out: Path, rng: random.Random) -> list[Case]:
    cases = []
    tj = json.loads(seeds["tokenizer.json"].read_text())
    variants = {
        "model-null": {**tj, "model": None}, "model-type": {**tj, "model": {**tj["model"], "type": "Nope"}},
        "vocab-list": {**tj, "model": {**tj["model"], "vocab": [1, 2]}},
        "merges-bad": {**tj, "model": {**tj["model"], "merges": [["a"], 3, None]}},
        "added-bad": {**tj, "added_tokens": [{"id": -5, "content": 3}]},
        "added-huge-id": {**tj, "added_tokens": [{"id": 2**40, "content": "<x>", "special": True}]},
        "normalizer-bad": {**tj, "normalizer": {"type": "Replace", "pattern": {"Regex": "("}, "content": ""}},
        "pretok-bad": {**tj, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "[["}, "behavior": "Isolated"}},
        "decoder-bad": {**tj, "decoder": {"type": "Nope"}},
        "vocab-empty": {**tj, "model": {**tj["model"], "vocab": {}}},
    }
    for name, doc in variants.items():
        f = out / f"tokjson-{name}.json"
        f.write_text(json.dumps(doc))
        cases.append(Case(f.name, "tokenizer.json", ["tokenize", str(f), "--text", "hello"]))
        d = out / f"hf-tokjson-{name}"
        _clone(seeds["hf"], d)
        _put(d / "tokenizer.json", json.dumps(doc).encode())
        cases.append(Case(d.name, "tokenizer.json in folder", ["info", str(d), "--device", "cpu"]))
    deep = out / "tokjson-deep.json"
    deep.write_text('{"model": ' + "[" * 50000 + "]" * 50000 + "}")
    cases.append(Case(deep.name, "tokenizer.json", ["tokenize", str(deep), "--text", "x"], "error"))
    # tiktoken ranks files: valid shape, broken content
    for i, text in enumerate(["YQ== 0\nYg== 0\n", "YQ== -1\n", "!!!! 1\n", "YQ== 99999999999999999999\n",
                              "YQ== 0\n" * 3, "YQ== 0\nYQ== 1\n"]):
        f = out / f"ranks-{i}.model"
        f.write_text(text)
        cases.append(Case(f.name, "tiktoken ranks", ["tokenize", str(f), "--text", "ab"]))
    sp = seeds["tokenizer.model"].read_bytes()
    for i in range(40):
        b = bytearray(sp)
        for _ in range(rng.choice((1, 4, 32))):
            b[rng.randrange(len(b))] = rng.randrange(256)
        f = out / f"sp-{i}.model"
        f.write_bytes(bytes(b))
        cases.append(Case(f.name, "sentencepiece model", ["tokenize", str(f), "--text", "hello world"]))
    return cases


def _tokjson_byte_cases(seeds, out: Path, seed: int, n: int = 50) -> list[Case]:
    """Byte flips, truncations and insertions in tokenizer.json, alone (``tokenize``) and in
    an HF folder (``info``): the one parser the per-file byte cases above do not reach.

    Its own random stream, so adding these left every earlier case as it was.
    """
    rng = random.Random(f"tokjson-bytes-{seed}")
    data = seeds["tokenizer.json"].read_bytes()
    cases = []
    for i in range(n):
        b = bytearray(data)
        op = i % 4
        if op == 0:  # truncate (mostly: JSON cut mid-token)
            b = b[: rng.randrange(len(b))]
        elif op == 1:  # flip bytes: broken JSON, invalid UTF-8, or valid JSON with odd strings
            for _ in range(rng.choice((1, 4, 32))):
                b[rng.randrange(len(b))] = rng.randrange(256)
        elif op == 2:  # a digit changed: ids, merges ranks and flags that still parse
            digits = [j for j, c in enumerate(b) if 0x30 <= c <= 0x39]
            for _ in range(rng.choice((1, 3, 10))):
                b[rng.choice(digits)] = rng.choice(b"0123456789-")
        else:  # junk inserted
            at = rng.randrange(len(b))
            b[at:at] = bytes(rng.randrange(256) for _ in range(rng.choice((1, 7, 100))))
        if i % 5 == 4:
            d = out / f"hf-tokjson-bytes{i}"
            _clone(seeds["hf"], d)
            _put(d / "tokenizer.json", bytes(b))
            cases.append(Case(d.name, "bytes of tokenizer.json in folder", ["info", str(d), "--device", "cpu"]))
        else:
            f = out / f"tokjson-bytes{i}.json"
            f.write_bytes(bytes(b))
            cases.append(Case(f.name, "bytes of tokenizer.json", ["tokenize", str(f), "--text", "hello world"]))
    return cases


def _special_file_cases(seeds, out: Path) -> list[Case]:
    cases = []

    def folder_with(kind, fname, make, expect="error"):
        d = out / f"special-{kind}-{fname.replace('.', '_')}-{make.__name__}"
        _clone(seeds[kind], d)
        (d / fname).unlink()
        make(d / fname)
        cases.append(Case(d.name, f"special file {make.__name__}", ["info", str(d), "--device", "cpu"], expect))

    def fifo(p):
        os.mkfifo(p)

    def devzero(p):
        os.symlink("/dev/zero", p)

    def devnull(p):
        os.symlink("/dev/null", p)

    def folder(p):
        p.mkdir()

    def sock(p):
        s = socket.socket(socket.AF_UNIX)
        try:
            s.bind(str(p))
        finally:
            s.close()

    def dangling(p):
        os.symlink(out / "nowhere", p)

    for make in (fifo, devzero, devnull, folder, sock, dangling):
        for kind, fname in (("meta", "params.json"), ("meta", "consolidated.00.pth"), ("meta", "tokenizer.model"),
                            ("hf", "config.json"), ("hf", "model.safetensors"), ("hf", "tokenizer.model")):
            try:
                folder_with(kind, fname, make)
            except OSError:
                pass
    for make in (fifo, devzero):
        f = out / f"special-gguf-{make.__name__}.gguf"
        make(f)
        cases.append(Case(f.name, f"special file {make.__name__}", ["info", str(f), "--device", "cpu"], "error"))
        cases.append(Case(f.name + "-tok", f"special file {make.__name__}", ["tokenize", str(f), "--text", "x"], "error"))
    # A 6 GB sparse "GGUF" of which only the magic is real: a magic check must not read it.
    big = out / "sparse-6g.gguf"
    with open(big, "wb") as fh:
        fh.write(b"GGUF" + (3).to_bytes(4, "little") + (2**60).to_bytes(8, "little") + (2**60).to_bytes(8, "little"))
        fh.truncate(6 << 30)
    cases.append(Case(big.name, "sparse huge file", ["tokenize", str(big), "--text", "x"], "error"))
    cases.append(Case(big.name + "-info", "sparse huge file", ["info", str(big), "--device", "cpu"], "error"))
    return cases


def _cli_cases(seeds, out: Path) -> list[Case]:
    g = str(seeds["gguf"])
    base = ["generate", g, "--prompt", "Once upon a time", "--max-new-tokens", "8", "--device", "cpu", "--seed", "1"]
    cases = [Case("cli-greedy", "sampler limits", base + ["--temperature", "0"], "ok")]
    for i, t in enumerate(("1e-40", "1e-30", "1e-9", "1e-6")):
        cases.append(Case(f"cli-temp-{i}", "sampler limits", base + ["--temperature", t], "same:cli-greedy"))
    for i, (opt, v) in enumerate([("--length-penalty", "1e308"), ("--length-penalty", "nan"), ("--repetition-penalty", "1e-45"),
                                  ("--repetition-penalty", "inf"), ("--temperature", "nan"), ("--temperature", "-1"),
                                  ("--top-p", "nan"), ("--top-p", "0"), ("--min-p", "nan"), ("--top-k", "-1"),
                                  ("--max-new-tokens", "0"), ("--seed", "-1"), ("--num-beams", "1000"),
                                  ("--temperature", "1e400"), ("--max-new-tokens", "-5")]):
        cases.append(Case(f"cli-opt-{i}", "sampler values", base + [opt, v], "error"))
    # --logit-bias TEXT=BIAS: a missing '=', no text, not a number, out of range, +inf
    for i, spec in enumerate(["girl", "=5", "girl=lots", "girl=+500", "girl=inf", "girl=nan"]):
        cases.append(Case(f"cli-bias-{i}", "logit bias", base + ["--logit-bias", spec], "error"))
    lane = ["compare", g, "--prompt", "Once", "--max-new-tokens", "4", "--device", "cpu", "--lane"]
    for i, spec in enumerate(["logit_bias=girl", "logit_bias==5", "temperature=0,logit_bias=girl=nan"]):
        cases.append(Case(f"cli-lane-bias-{i}", "logit bias", lane + [spec], "error"))
    bad_utf8 = os.fsdecode(b"caf\xe9 \xff\xfe \xed\xa0\x80 end")
    for i, argv in enumerate([
        ["generate", g, "--prompt", bad_utf8, "--max-new-tokens", "4", "--device", "cpu", "--seed", "1"],
        ["generate", g, "--prompt", "hi", "--chat", "--system", bad_utf8, "--max-new-tokens", "4", "--device", "cpu"],
        ["tokenize", g, "--text", bad_utf8],
        ["tokenize", str(seeds["tokenizer.model"]), "--text", bad_utf8],
        ["tokenize", str(seeds["tokenizer.json"]), "--text", bad_utf8],
        ["tokenize", str(seeds["hf"]), "--text", bad_utf8, "--chat"],
    ]):
        cases.append(Case(f"cli-utf8-{i}", "invalid UTF-8 argument", argv, "either"))
    # Speculative decoding: any drafter must give the greedy output; a bad lookup value or a
    # draft "model" that is missing, no model or a piece of one is refused with one line.
    greedy = base + ["--temperature", "0"]
    cases += [Case("cli-lookup-ok", "speculative decoding", greedy + ["--lookup", "3"], "same:cli-greedy"),
              Case("cli-draft-self", "speculative decoding", greedy + ["--draft", g], "same:cli-greedy")]
    for i, extra in enumerate([["--lookup", "-1"], ["--lookup", "9"], ["--lookup", "nan"], ["--lookup", "1e9"],
                               ["--lookup", "2", "--draft", g], ["--draft", str(out / "no-such-draft.gguf")],
                               ["--draft", str(seeds["tokenizer.json"])], ["--draft", str(seeds["meta"] / "params.json")],
                               ["--draft", ""], ["--lookup", "2", "--num-beams", "2"]]):
        cases.append(Case(f"cli-spec-{i}", "speculative decoding", greedy + extra, "error"))
    # A comparison lane's own draft model (the app's lane editor sends the same): missing, no
    # model, or beside prompt lookup; an empty one is no draft.
    for i, spec in enumerate([f"draft={out / 'no-such-draft.gguf'}", f"draft={seeds['tokenizer.json']}",
                              f"lookup=2,draft={g}"]):
        cases.append(Case(f"cli-lane-draft-{i}", "speculative decoding", lane + [f"temperature=0,{spec}"], "error"))
    cases.append(Case("cli-lane-draft-empty", "speculative decoding", lane + ["temperature=0,draft="], "ok"))
    return cases + _constraint_cases(g, out, greedy) + _cli_backend_cases(seeds, out, g)


def _cli_backend_cases(seeds, out: Path, g: str) -> list[Case]:
    cases = []
    # Comparison lanes that name their own model: a missing path, a file that is no model,
    # a damaged checkpoint, a server that refuses, a URL that is not HTTP.
    lane = ["compare", g, "--prompt", "Once", "--max-new-tokens", "4", "--device", "cpu", "--lane", "temperature=0"]
    for i, backend in enumerate([f"model={out / 'no-such-model.gguf'}", f"model={seeds['tokenizer.json']}",
                                 f"model={seeds['meta'] / 'params.json'}", "server=http://127.0.0.1:1",
                                 "server=ftp://127.0.0.1/x", "server=http://127.0.0.1:1,model=x"]):
        cases.append(Case(f"cli-lane-model-{i}", "comparison lane model", lane + ["--lane", f"temperature=0,{backend}"],
                          "error"))
    # Server addresses as a user types them (the app's Connect to Server dialog uses the same
    # client): no scheme, another scheme, a broken IPv6 host, a port out of range, no host,
    # nothing listening.
    for i, url in enumerate(["127.0.0.1:8000", "ftp://127.0.0.1/v1", "http://[::1", "http://127.0.0.1:99999",
                             "http://", "http://127.0.0.1:1", "http://127.0.0.1:1/v1/"]):
        cases.append(Case(f"cli-server-url-{i}", "server URL", ["generate", "--server", url, "--prompt", "Hi"], "error"))
    # A folder whose name is not UTF-8 must load like any other.
    for kind in ("meta", "hf"):
        d = Path(os.fsdecode(bytes(out) + b"/nonutf8-\xff\xfe-" + kind.encode()))
        _clone(seeds[kind], d)
        cases.append(Case(f"nonutf8-{kind}", "non-UTF-8 folder name", ["info", str(d), "--device", "cpu"], "ok"))
    return cases


def _constraint_cases(g: str, out: Path, greedy: list[str]) -> list[Case]:
    """--json-schema / --regex / --grammar as text and as @FILE: a valid schema must hold the
    output; files that are no text, special, huge or missing, schemas that are no schema or
    nest 100,000 deep, regexes and grammars that do not parse, blow up or recurse are refused
    with one line (or, where they compile, run: only tracebacks, hangs and peaks count)."""
    d = out / "constraints"
    d.mkdir(parents=True, exist_ok=True)
    files = {"deep.json": b"[" * 100_000 + b"]" * 100_000, "latin1.json": b'{"type": "string", "pattern": "caf\xe9"}',
             "huge.json": b'{"type": "object", "description": "' + b"x" * 600_000 + b'"}', "empty.gbnf": b"",
             "nul.gbnf": b'root ::= "a\x00b"', "cycle.json": b'{"$ref": "#/definitions/a", "definitions": '
             b'{"a": {"$ref": "#/definitions/b"}, "b": {"$ref": "#/definitions/a"}}}',
             "long.re": b"(ab|cd)" * 2000, "nested.json": b'{"type": "array", "items": ' * 300 + b"{}" + b"}" * 300}
    for name, data in files.items():
        _put(d / name, data)
    cases = [Case("cli-constraint-ok", "constraint", greedy + ["--max-new-tokens", "40", "--json-schema",
                  '{"type": "object", "properties": {"n": {"type": "integer", "maximum": 9}}, "required": ["n"], '
                  '"additionalProperties": false}'], "ok")]
    bad = [["--json-schema", "{"], ["--json-schema", "[]"], ["--json-schema", '{"type": 5}'],
           ["--json-schema", '{"minLength": -1, "type": "string"}'], ["--regex", "("],
           ["--grammar", "root ::= undefined"], ["--grammar", "start: start"], ["--regex", ""],
           ["--json-schema", "@" + str(d / "deep.json")], ["--json-schema", "@" + str(d / "huge.json")],
           ["--json-schema", "@" + str(d / "missing.json")], ["--grammar", "@" + str(d)],
           ["--grammar", "@/dev/zero"], ["--grammar", "@" + str(d / "empty.gbnf")],
           # too big or pathological (MAX_REGEX_CHARS, MAX_SCHEMA_DEPTH, llguidance's lexer limits a token in)
           ["--regex", "a" * 100_000], ["--regex", "@" + str(d / "long.re")], ["--regex", "a{99999999}"],
           ["--json-schema", "@" + str(d / "nested.json")]]
    for i, extra in enumerate(bad):
        cases.append(Case(f"cli-constraint-bad-{i}", "constraint", greedy + extra, "error"))
    for i, extra in enumerate([["--json-schema", "@" + str(d / "latin1.json")], ["--json-schema", "@" + str(d / "cycle.json")],
                               ["--grammar", "@" + str(d / "nul.gbnf")], ["--regex", "(a+)+$"],
                               ["--regex", "(x|y){0,9999}"], ["--json-schema", '{"type": "array", "minItems": 100000}'],
                               # the lexer's limits ~29 tokens in: past max-new-tokens here, else exit 2 saying so
                               ["--regex", "((a{1,50}){1,50}){1,50}"]]):
        cases.append(Case(f"cli-constraint-odd-{i}", "constraint", greedy + extra, "either"))
    return cases


def _put(path: Path, data: bytes) -> None:
    """Replace a file of a cloned folder without writing through its hard link to the seed."""
    if path.exists() or path.is_symlink():
        path.unlink()
    path.write_bytes(data)


def _clone(src: Path, dst: Path) -> None:
    """A copy of a seed folder whose unchanged files are hard links (the corpus stays small)."""
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for f in src.iterdir():
        try:
            os.link(f, dst / f.name)
        except OSError:
            shutil.copy(f, dst / f.name)


def generate(out: Path, *, seed: int = 0, per_file: int = 110) -> list[Case]:
    """Write the corpus under ``out`` and return its cases (same seed, same corpus)."""
    rng = random.Random(seed)
    for sub in ("seeds", "inputs", "run"):
        if (out / sub).exists():
            shutil.rmtree(out / sub)
    seeds = make_seeds(out / "seeds")
    work = out / "inputs"
    work.mkdir(parents=True, exist_ok=True)
    cases: list[Case] = []
    cases += [Case("seed-gguf", "valid seed", ["info", str(seeds["gguf"]), "--device", "cpu"], "ok"),
              Case("seed-meta", "valid seed", ["info", str(seeds["meta"]), "--device", "cpu"], "ok"),
              Case("seed-hf", "valid seed", ["info", str(seeds["hf"]), "--device", "cpu"], "ok")]
    cases += _json_cases(seeds, work, rng)
    cases += _gguf_kv_cases(seeds, work)
    cases += _silent_cases(seeds, work)
    cases += _tokenizer_cases(seeds, work, rng)
    cases += _special_file_cases(seeds, work)
    cases += _cli_cases(seeds, work)
    cases += _byte_cases(seeds, work, rng, per_file)
    cases += _tokjson_byte_cases(seeds, work, seed)
    # The model library's scanner reads every header in the corpus at once: a broken file
    # is listed with its error, never a failed scan (python -m core models).
    cases.append(Case("library-scan", "model library", ["models", "--folder", str(work), "--json"], "ok"))
    for i, ep in enumerate(("http://127.0.0.1:9", "not a url", "ftp://127.0.0.1/", "http://", "https://[::1",
                              "http://h:99999", "http://h:x")):
        cases.append(Case(f"pull-endpoint-{i}", "model library", ["pull", "a/b", "--endpoint", ep], "error"))
    return cases
