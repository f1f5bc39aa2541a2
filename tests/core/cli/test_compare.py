"""`python -m core compare`: lanes over one prompt, each lane's own settings and logit bias."""
import json

import pytest

from core.checkpoints import load
from tests.core.cli.helpers import run_cli


def test_compare_json(capsys, tiny_meta_dir):
    rc, out, err = run_cli(capsys, "compare", tiny_meta_dir, "--prompt", "Hello", "--max-new-tokens", "5",
                           "--lane", "temperature=0", "--lane", "temperature=1.0,top_p=0.9,seed=7",
                           "--lane", "temperature=1.0,top_p=0.9,seed=7,max_new_tokens=3", "--json")
    assert rc == 0, err
    obj = json.loads(out)
    lanes = obj["lanes"]
    assert [len(l["tokens"]) for l in lanes] == [5, 5, 3]
    assert lanes[1]["tokens"][:3] == lanes[2]["tokens"]
    assert lanes[1]["settings"]["seed"] == 7 and lanes[1]["settings"]["top_p"] == 0.9
    assert set(obj["timings"]) >= {"prefill_s", "decode_s", "total_s"}
    assert all(set(l) >= {"settings", "text", "tokens", "logprobs", "stop_reason", "stats"} for l in lanes)


def test_a_beam_lane_in_compare_is_generates_beam_search(capsys, tiny_meta_dir):
    base = ["--prompt", "Hello", "--max-new-tokens", "5", "--json", "--device", "cpu"]
    rc, out, err = run_cli(capsys, "compare", tiny_meta_dir, *base, "--lane", "temperature=0",
                           "--lane", "num_beams=3,length_penalty=0.5")
    assert rc == 0, err
    lanes = json.loads(out)["lanes"]
    rc, out, err = run_cli(capsys, "generate", tiny_meta_dir, *base, "--num-beams", "3", "--length-penalty", "0.5")
    assert rc == 0, err
    alone = json.loads(out)
    def same(beams):  # float rounding aside (the comparison's prefill ran beside another lane)
        return [(b["tokens"], b["text"], b["stop_reason"]) for b in beams]
    assert same(lanes[1]["beams"]) == same(alone["beams"]) and len(alone["beams"]) == 3
    assert [b["score"] for b in lanes[1]["beams"]] == pytest.approx([b["score"] for b in alone["beams"]], abs=1e-4)
    assert lanes[1]["tokens"] == alone["tokens"]
    assert lanes[1]["settings"]["num_beams"] == 3 and "beams" not in lanes[0]
    rc, out, _ = run_cli(capsys, "compare", tiny_meta_dir, *base[:4], "--lane", "num_beams=2")
    assert rc == 0 and "num_beams=2 length_penalty=1.0" in out and "temperature=" not in out


def test_logit_bias_per_lane_in_compare(capsys, fixtures):
    """A lane's own logit_bias= items bias only that lane (after --logit-bias's), and
    --json carries them as text and as the ids this checkpoint's tokenizer gave."""
    model = fixtures / "stories260K.gguf"
    tok = load(model, device="cpu", dtype="float32").tokenizer
    girl, lily = tok.encode("girl"), tok.encode("Lily")
    rc, out, err = run_cli(capsys, "compare", model, "--prompt", "Once upon a time", "--max-new-tokens", "16",
                           "--lane", "temperature=0", "--lane", "temperature=0,logit_bias=girl=-inf",
                           "--lane", "temperature=0,logit_bias=girl=-inf,logit_bias=Lily=+100", "--json")
    assert rc == 0, err
    plain, banned, both = json.loads(out)["lanes"]
    assert set(girl) <= set(plain["tokens"]) and not set(girl) & set(banned["tokens"])
    assert plain["tokens"][:3] == banned["tokens"][:3] != both["tokens"][:3]  # the ban acts only where 'girl' came
    assert both["tokens"][0] in lily and not set(girl) & set(both["tokens"])
    assert plain["settings"]["logit_bias_text"] == [] and plain["settings"]["logit_bias"] == {}
    assert banned["settings"]["logit_bias_text"] == ["girl=-inf"]
    assert banned["settings"]["logit_bias"] == {str(t): "-inf" for t in girl}
    assert both["settings"]["logit_bias_text"] == ["girl=-inf", "Lily=+100"]
    # --logit-bias comes first in every lane; a lane's own item for the same text wins
    rc, out, err = run_cli(capsys, "compare", model, "--prompt", "Once upon a time", "--max-new-tokens", "8",
                           "--lane", "temperature=0", "--lane", "temperature=0,logit_bias=girl=0",
                           "--logit-bias", "girl=-inf", "--json")
    assert rc == 0, err
    lanes = json.loads(out)["lanes"]
    assert lanes[0]["settings"]["logit_bias"] == {str(t): "-inf" for t in girl}
    assert lanes[1]["settings"]["logit_bias_text"] == ["girl=-inf", "girl=0"]
    assert lanes[1]["settings"]["logit_bias"] == {str(t): 0.0 for t in girl}
    # the text header names a lane's bias
    rc, out, err = run_cli(capsys, "compare", model, "--prompt", "Once", "--max-new-tokens", "2",
                           "--lane", "temperature=0,logit_bias=girl=-inf")
    assert rc == 0 and "logit bias girl=-inf" in out, err


@pytest.mark.parametrize("lane,needle", [
    ("logit_bias=girl", "TEXT=BIAS"), ("logit_bias==5", "TEXT=BIAS"), ("logit_bias=girl=lots", "not a number"),
    ("temperature=0,logit_bias=girl=+500", "between"),
    # a LlamaDesk server takes a bias by text (test_lane_knobs.py); this one is not there
    ("logit_bias=girl=1,server=http://127.0.0.1:9", "cannot connect"),
    # no server runs beam search: said before connecting
    ("num_beams=2,server=http://127.0.0.1:9", "local model only"),
])
def test_bad_lane_logit_bias_exits_2_with_one_line(capsys, fixtures, lane, needle):
    rc, out, err = run_cli(capsys, "compare", fixtures / "stories260K.gguf", "--prompt", "Hi", "--lane", lane)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and needle in err, err
