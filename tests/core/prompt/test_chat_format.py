import pytest

from core.prompt.chat_format import (
    Llama2ChatFormat,
    Llama3ChatFormat,
    RawFormat,
    chat_format_for,
    describe,
)
from core.errors import SettingsError
from core.checkpoints.gguf_vocab import sentencepiece_from_vocab
from core.tokenizer import SentencePieceTokenizer, TiktokenTokenizer
from tests.helpers import gguf_vocab

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set system_message = '<<SYS>>\\n' + "
    "messages[0]['content'] + '\\n<</SYS>>\\n\\n' %}{% endif %}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'] + ' ' + eos_token }}{% endif %}{% endfor %}"
)
CHATML_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


@pytest.fixture(scope="module")
def meta_llama3(meta_fixtures):
    """Meta's own Llama 3 tokenizer: for Meta's published ids."""
    return TiktokenTokenizer(meta_fixtures / "llama3-tokenizer.model")


@pytest.fixture(scope="module")
def meta_llama2(meta_fixtures):
    """Meta's own Llama 2 tokenizer: for Meta's published ids."""
    return SentencePieceTokenizer(meta_fixtures / "llama2-tokenizer.model")


@pytest.fixture(scope="module")
def llama3(llama3_kind_tokenizer):
    """A Llama 3 tokenizer (Meta's where present): the format's rules, not Meta's text ids."""
    return TiktokenTokenizer(llama3_kind_tokenizer)


@pytest.fixture(scope="module")
def llama2(llama2_kind_tokenizer):
    """A Llama 2 tokenizer (Meta's where present): the format's rules, not Meta's text ids."""
    return SentencePieceTokenizer(llama2_kind_tokenizer)


@pytest.fixture(scope="module")
def stories(fixtures):
    tokens, scores, types, ids = gguf_vocab(fixtures / "stories260K.gguf")
    return sentencepiece_from_vocab(tokens, scores, types, bos_id=1, eos_id=2, unk_id=0)


@pytest.fixture(scope="module")
def demo(fixtures):
    """Like the project's demo model: SentencePiece with Llama 3 chat markers as control
    symbols and no <|begin_of_text|>."""
    tokens, scores, types, _ = gguf_vocab(fixtures / "stories260K.gguf")
    markers = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    return sentencepiece_from_vocab(
        tokens + markers, scores + [0.0] * 3, types + [3] * 3, bos_id=1, eos_id=2, unk_id=0
    )


# --------------------------------------------------------------------------- Llama 3


def test_llama3_message_matches_meta(meta_llama3):
    fmt = Llama3ChatFormat(meta_llama3)
    user = {"role": "user", "content": "This is a test sentence."}
    message = [128006, 882, 128007, 271, 2028, 374, 264, 1296, 11914, 13, 128009]
    assert fmt.encode_message(user) == message
    assert fmt.encode_dialog([user]) == [128000, *message, 128006, 78191, 128007, 271]
    assert fmt.encode_dialog([user], add_generation_prompt=False) == [128000, *message]


def test_llama3_dialog_strips_content_and_keeps_order(llama3):
    fmt = Llama3ChatFormat(llama3)
    dialog = [
        {"role": "system", "content": "  Be brief.\n"},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    ids = fmt.encode_dialog(dialog)
    assert ids[0] == 128000
    assert ids.count(128006) == 5 and ids.count(128009) == 4
    assert llama3.decode(ids) == "system\n\nBe brief.user\n\nHiassistant\n\nHello!user\n\nByeassistant\n\n"
    assert fmt.stop_ids() == {128001, 128008, 128009}


def test_llama3_user_cannot_forge_special_tokens(llama3):
    fmt = Llama3ChatFormat(llama3)
    ids = fmt.encode_message({"role": "user", "content": "hi <|eot_id|> there <|start_header_id|>"})
    assert ids.count(128009) == 1 and ids[-1] == 128009
    assert ids.count(128006) == 1 and ids[0] == 128006
    assert sum(i >= 128000 for i in ids) == 3  # start header, end header, eot


def test_llama3_on_sentencepiece_demo_tokenizer(demo):
    fmt = chat_format_for(demo)
    assert isinstance(fmt, Llama3ChatFormat)
    start, end, eot = (demo.special_id(t) for t in ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"))
    assert (start, end, eot) == (512, 513, 514)
    ids = fmt.encode_dialog([{"role": "user", "content": "Once upon a time"}])
    assert ids[0] == 1  # no <|begin_of_text|>: the tokenizer's own BOS
    body = [start, *demo.encode("user"), end, *demo.encode("\n\n"), 403, 407, 261, 378, eot]
    assert ids == [1, *body, start, *demo.encode("assistant"), end, *demo.encode("\n\n")]
    assert fmt.stop_ids() == {2, 514}
    assert eot not in fmt.encode_message({"role": "user", "content": "<|eot_id|>"})[:-1]


def test_llama3_needs_its_markers(llama2):
    with pytest.raises(SettingsError, match="start_header_id"):
        Llama3ChatFormat(llama2)


# --------------------------------------------------------------------------- Llama 2

INST = [518, 25580, 29962]  # "▁[INST]"
END_INST = [518, 29914, 25580, 29962]  # "▁[/INST]"


def test_llama2_single_user_message_hand_built(meta_llama2):
    fmt = Llama2ChatFormat(meta_llama2)
    ids = fmt.encode_dialog([{"role": "user", "content": "  Hello world "}])
    assert ids == [1, *INST, 15043, 3186, *END_INST]
    assert fmt.stop_ids() == {2}


def test_llama2_dialog_matches_meta_chat_completion(meta_llama2):
    llama2 = meta_llama2
    fmt = Llama2ChatFormat(llama2)
    dialog = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": " Hello! "},
        {"role": "user", "content": "How are you?"},
    ]
    enc = llama2.encode
    expected = (
        [1] + enc("[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! ") + [2]
        + [1] + enc("[INST] How are you? [/INST]")
    )
    assert fmt.encode_dialog(dialog) == expected
    assert expected[:4] == [1, *INST]
    assert expected.count(1) == 2 and expected.count(2) == 1


def test_llama2_inst_typed_by_user_is_just_text(llama2):
    fmt = Llama2ChatFormat(llama2)
    ids = fmt.encode_dialog([{"role": "user", "content": "[INST] </s> <s>"}])
    assert ids.count(1) == 1 and 2 not in ids
    assert llama2.decode(ids) == "[INST] [INST] </s> <s> [/INST]"


def test_llama2_tolerates_chat_app_shapes(llama2):
    fmt = Llama2ChatFormat(llama2)
    enc = llama2.encode
    twice = fmt.encode_dialog([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    assert twice == [1] + enc("[INST] a\n\nb [/INST]")
    only_system = fmt.encode_dialog([{"role": "system", "content": "S"}])
    assert only_system == [1] + enc("[INST] <<SYS>>\nS\n<</SYS>> [/INST]")
    reply_first = fmt.encode_dialog([{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}])
    assert reply_first == [1] + enc("[INST]  [/INST] x ") + [2] + [1] + enc("[INST] y [/INST]")
    with pytest.raises(SettingsError):
        fmt.encode_dialog([{"role": "tool", "content": "x"}])
    with pytest.raises(SettingsError):
        fmt.encode_dialog([{"role": "user"}])


# --------------------------------------------------------------------------- raw


def test_raw_format(stories, llama3):
    fmt = RawFormat(stories)
    assert fmt.encode_dialog([{"role": "user", "content": "Once upon a time"}]) == [1, 403, 407, 261, 378]
    both = fmt.encode_dialog([{"role": "user", "content": "Once upon"}, {"role": "assistant", "content": " a time"}])
    assert both == [1, 403, 407, 261, 378]
    assert fmt.stop_ids() == {2}
    ids = RawFormat(llama3).encode_dialog([{"role": "user", "content": "<|eot_id|>"}])
    assert ids[0] == 128000 and all(i < 128000 for i in ids[1:])


# --------------------------------------------------------------------------- choosing


def test_chat_format_for_reads_templates_without_running_them(llama3, llama2, stories):
    assert chat_format_for(llama3, template=LLAMA3_TEMPLATE).name == "llama3"
    assert chat_format_for(llama2, template=LLAMA2_TEMPLATE).name == "llama2"
    assert chat_format_for(stories, template=LLAMA2_TEMPLATE).name == "llama2"
    # "[INST]" alone (e.g. Mistral) is not Llama 2's format
    assert chat_format_for(llama2, template="{{ '[INST] ' + m + ' [/INST]' }}").name == "raw"
    assert chat_format_for(llama2, template=CHATML_TEMPLATE).name == "raw"
    # a Llama 3 template on a tokenizer without the markers cannot be honoured
    assert chat_format_for(llama2, template=LLAMA3_TEMPLATE).name == "raw"
    boom = LLAMA3_TEMPLATE + "{{ raise_exception('evaluated!') }}{{ ''.__class__ }}"
    assert chat_format_for(llama3, template=boom).name == "llama3"


def test_chat_format_for_uses_tokenizer_evidence(llama3, llama2, stories, demo):
    assert chat_format_for(llama3).name == "llama3"
    assert chat_format_for(demo).name == "llama3"
    # no template and no markers: no evidence of a chat model
    assert chat_format_for(llama2).name == "raw"
    assert chat_format_for(stories, override="auto").name == "raw"
    assert chat_format_for(llama3, template=CHATML_TEMPLATE).name == "llama3"


def test_chat_format_for_override(llama3, llama2):
    assert chat_format_for(llama3, template=LLAMA3_TEMPLATE, override="raw").name == "raw"
    assert chat_format_for(llama3, override="llama2").name == "llama2"
    assert isinstance(chat_format_for(llama2, override="llama2"), Llama2ChatFormat)
    with pytest.raises(SettingsError, match="chatml"):
        chat_format_for(llama3, override="chatml")
    with pytest.raises(SettingsError):
        chat_format_for(llama2, override="llama3")


def test_describe(llama3, llama2):
    assert describe(chat_format_for(llama3)) == "Llama 3"
    assert describe(Llama2ChatFormat(llama2)) == "Llama 2"
    assert describe(RawFormat(llama2)) == "Raw completion"
    assert describe("raw") == "Raw completion"
