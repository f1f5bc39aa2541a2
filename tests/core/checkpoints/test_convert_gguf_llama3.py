"""convert --to gguf on Llama 3 models: the GGUF "gpt2" vocabulary (tokens, merges, token
types, pre-tokenizer "llama-bpe", special ids) that LlamaDesk and llama.cpp read back with
the tokenizer's own ids (issue 22, item 22)."""
from __future__ import annotations

import base64
import json
import random
import shutil
import urllib.request
from types import SimpleNamespace

import pytest
import torch
from gguf import GGUFReader

from bench.llamacpp_server import LlamaServer, import_llama_cpp, why_not
from core.checkpoints import load
from core.checkpoints.convert import convert
from core.checkpoints.meta import save_meta
from core.cli.main import main
from core.model.args import ModelArgs
from core.model.transformer import Transformer
from core.tokenizer import LLAMA3_PATTERN, LLAMA3_SPECIAL_TOKENS, TiktokenTokenizer
from tests.core.tokenizer.test_tokenizer import SAMPLES
from tests.generated import tiktoken_ranks
from tests.helpers import greedy, tiny_hf

RANKS = 1024  # a Llama 3-kind ranks file this small converts in well under a second
ATOMS = ["the", " cat", "Hello", " WORLD", "'s", "'LL", " don't", "ñ", "日本", "👋🏽", "0", "42", "123456",
         " ", "  ", "\t", "\n", "\n\n", "\r\n", "(", "=>", "<|eot_id|>", "<s>", "__init__", "Straße", "\u00a0"]

# Tokens across the places where Llama 3's split differs from other byte-level splits (digit
# runs, contractions in capitals, a mark before a word): with them in the vocabulary, a file
# read under another pre-tokenizer than "llama-bpe" gives other ids.
ACROSS = [b"12", b"45", b"123", b"456", b"1234", b"123456", b"'L", b"'LL", b"(t", b"(the"]


def texts(seed=5, n=120):
    rng = random.Random(seed)
    return list(SAMPLES) + ["".join(rng.choice(ATOMS) for _ in range(rng.randint(1, 10))) for _ in range(n)]


def field(reader, key):
    return reader.fields[key].contents()


@pytest.fixture(scope="module")
def llama3_hf(tmp_path_factory):
    """A tiny Llama 3-kind HF folder: tokenizer.json made from a tiktoken ranks file by
    transformers' own converter (as Meta's checkpoints are converted to HF), special tokens
    at Meta's offsets after the ranks, the model's embedding one row per token."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    root = tmp_path_factory.mktemp("llama3")
    ranks = tiktoken_ranks(root / "tokenizer.model", RANKS)
    lines = ranks.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if base64.b64decode(line.split()[0]).startswith(b"<unused"))
    for i, token in enumerate(ACROSS):  # in place of the first placeholders, so merges can build each
        lines[first + i] = f"{base64.b64encode(token).decode()} {first + i}"
    ranks.write_text("\n".join(lines) + "\n")
    tok = TikTokenConverter(vocab_file=str(ranks), pattern=LLAMA3_PATTERN,
                            extra_special_tokens=list(LLAMA3_SPECIAL_TOKENS)).converted()
    folder = root / "hf"
    tiny_hf(3, vocab_size=tok.get_vocab_size(), num_key_value_heads=2).save_pretrained(folder)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "tokenizer_class": "PreTrainedTokenizerFast"}))
    return folder, ranks


@pytest.fixture(scope="module")
def converted(llama3_hf, tmp_path_factory):
    folder, _ = llama3_hf
    dst = tmp_path_factory.mktemp("out") / "llama3.gguf"
    assert main(["convert", str(folder), str(dst), "--to", "gguf", "--type", "F32"]) == 0
    return dst


def test_the_gguf_holds_llama_cpps_gpt2_vocabulary(llama3_hf, converted):
    from tokenizers import Tokenizer

    src = Tokenizer.from_file(str(llama3_hf[0] / "tokenizer.json"))
    r = GGUFReader(str(converted))
    assert field(r, "tokenizer.ggml.model") == "gpt2" and field(r, "tokenizer.ggml.pre") == "llama-bpe"
    tokens, types = field(r, "tokenizer.ggml.tokens"), field(r, "tokenizer.ggml.token_type")
    n = src.get_vocab_size()
    assert len(tokens) == len(types) == n == RANKS + 256
    assert tokens == [src.id_to_token(i) for i in range(n)]  # GPT-2's byte alphabet, as in tokenizer.json
    assert types == [1] * RANKS + [3] * 256  # normal, then Meta's 256 control tokens
    merges = field(r, "tokenizer.ggml.merges")
    model = json.loads(src.to_str())["model"]
    assert merges == [m if isinstance(m, str) else " ".join(m) for m in model["merges"]] and merges
    assert field(r, "tokenizer.ggml.bos_token_id") == RANKS  # <|begin_of_text|>
    assert field(r, "tokenizer.ggml.eos_token_id") == RANKS + 9  # <|eot_id|>, as tokenizer_config says
    assert field(r, "tokenizer.ggml.eot_token_id") == RANKS + 9
    assert field(r, "tokenizer.ggml.add_bos_token") is True
    embd = next(t for t in r.tensors if t.name == "token_embd.weight")
    assert embd.shape.tolist() == [64, n]  # one row per token, as llama.cpp checks


def test_the_converted_file_gives_the_hf_tokenizers_ids_and_the_same_logits(llama3_hf, converted):
    folder, ranks = llama3_hf
    a, b = load(folder, device="cpu", dtype="float32"), load(converted, device="cpu", dtype="float32")
    reference = TiktokenTokenizer(ranks)  # tiktoken itself, over the ranks the tokenizer.json came from
    for text in texts():
        want = reference.encode(text, bos=True)
        assert a.tokenizer.encode(text, bos=True) == want, repr(text)
        assert b.tokenizer.encode(text, bos=True) == want, repr(text)
    assert b.tokenizer.decode(b.tokenizer.encode(SAMPLES[0])) == SAMPLES[0]
    assert (b.tokenizer.bos_id, b.tokenizer.eos_id) == (RANKS, RANKS + 9)
    assert b.stop_ids >= {RANKS + 1, RANKS + 9} and b.chat_format.name == a.chat_format.name == "llama3"
    ids = torch.tensor([a.tokenizer.encode("Hello world, the cat", bos=True)])
    with torch.no_grad():
        torch.testing.assert_close(b.model(ids), a.model(ids), atol=1e-5, rtol=0)


def test_llama_cpp_reads_the_same_ids(converted, llama3_hf):
    try:
        llama_cpp = import_llama_cpp()  # bound to the prebuilt libllama of the bench extra
    except ImportError as e:
        pytest.skip(f"llama.cpp's reading of the file is unchecked: {e}")
    reference = TiktokenTokenizer(llama3_hf[1])
    llm = llama_cpp.Llama(str(converted), vocab_only=True, verbose=False)
    for text in texts(seed=9, n=60):
        assert llm.tokenize(text.encode(), add_bos=True, special=False) == reference.encode(text, bos=True), repr(text)
    assert llm.token_bos() == RANKS and llm.token_eos() == RANKS + 9


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def llama_server(converted):
    """llama.cpp's own llama-server (the bench extra's prebuilt wheel; on the CPU backend when
    no Vulkan device is present) serving the converted file, with float32 attention and cache
    as ours (flash attention's float16 turns near-ties into other greedy tokens)."""
    if why_not():
        pytest.skip(f"llama.cpp's reading of the file is unchecked: {why_not()}")
    with LlamaServer(converted, ctx=256, extra=("--no-warmup", "-fa", "off", "-ctk", "f32", "-ctv", "f32")) as srv:
        yield srv.base


def test_llama_server_reads_the_converted_file_with_our_ids_and_greedy_tokens(llama_server, converted, llama3_hf):
    """llama.cpp itself (not a Python port of it) splits text as we do and, on the same
    weights, picks the same greedy tokens: the GGUF says what llama.cpp needs to know."""
    ours = load(converted, device="cpu", dtype="float32")
    reference = TiktokenTokenizer(llama3_hf[1])
    for text in texts(seed=9, n=60) + ["<|begin_of_text|>hi<|eot_id|>", "x = 1234567 + 89\n\n\t  y", "(the 'LL"]:
        got = post(llama_server + "/tokenize", {"content": text, "add_special": False, "parse_special": False})
        want = reference.encode(text)
        assert got["tokens"] == want, repr(text)
        assert ours.tokenizer.encode(text) == want, repr(text)
    for prompt in ("Hello the cat", "日本 don't 42\n"):
        ids = ours.tokenizer.encode(prompt, bos=True)
        expect, logprobs = greedy(ours.model, ids, 6)
        got = post(llama_server + "/completion", {"prompt": prompt, "n_predict": 6, "temperature": 0, "n_probs": 1,
                                                  "post_sampling_probs": False, "cache_prompt": False,
                                                  "return_tokens": True})
        assert got["tokens"] == expect, prompt
        theirs = torch.tensor([step["logprob"] for step in got["completion_probabilities"]])
        torch.testing.assert_close(theirs, logprobs, atol=1e-4, rtol=0)
        assert got["tokens_evaluated"] == len(ids)  # llama.cpp added the same <|begin_of_text|>


def test_a_byte_level_tokenizer_that_does_not_split_like_llama3_is_refused(llama3_hf, tmp_path, capsys):
    folder = tmp_path / "other"
    shutil.copytree(llama3_hf[0], folder)
    doc = json.loads((folder / "tokenizer.json").read_text())
    doc["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\w+|\s+|[^\w\s]+"  # GPT-2-like, not Llama 3's
    (folder / "tokenizer.json").write_text(json.dumps(doc))
    dst = tmp_path / "other.gguf"
    assert main(["convert", str(folder), str(dst), "--to", "gguf"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not Llama 3's byte-level BPE" in err and "llama-bpe" in err
    assert not dst.exists() and not list(tmp_path.glob(".other.gguf*"))  # nothing half-written


def test_a_meta_llama3_folder_converts_from_its_tiktoken_ranks(llama3_hf, tmp_path):
    """A Meta folder's tokenizer.model (tiktoken ranks, the special tokens after them) is
    written the same way. (Meta's own 128,256-token file takes this path too; it was
    checked by hand to give Meta's published ids, and is too slow to convert in the suite.)"""
    ranks = llama3_hf[1]
    args = ModelArgs(dim=16, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=RANKS + 256, hidden_dim=32,
                     max_seq_len=64)
    torch.manual_seed(0)
    folder = save_meta(SimpleNamespace(args=args, model=Transformer(args).eval()), tmp_path / "meta",
                       tokenizer_file=ranks)
    dst = convert(folder, tmp_path / "m.gguf", fmt="gguf", qtype="F32")
    b = load(dst, device="cpu", dtype="float32")
    r = GGUFReader(str(dst))
    assert field(r, "tokenizer.ggml.model") == "gpt2" and field(r, "tokenizer.ggml.pre") == "llama-bpe"
    assert field(r, "tokenizer.ggml.eos_token_id") == RANKS + 1  # Meta's eos: <|end_of_text|>
    reference = TiktokenTokenizer(ranks)
    for text in texts(seed=11, n=40):
        assert b.tokenizer.encode(text, bos=True, eos=True) == reference.encode(text, bos=True, eos=True), repr(text)
