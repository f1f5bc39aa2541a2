"""core.worker.protocol: the worker's requests and events are plain data that import no torch."""
import subprocess
import sys
from pathlib import Path

from core.engine.settings import SamplingParams
from core.worker.protocol import CompareRequest, GenerateRequest, PromptRequest

ROOT = Path(__file__).resolve().parents[3]


def test_importing_the_protocol_does_not_import_torch():
    code = ("import sys; import core.worker.protocol; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         check=True).stdout.strip()
    assert out == "[]"


def test_a_branch_is_a_request_with_kept_or_forced_tokens():
    assert not GenerateRequest(messages=[{"role": "user", "content": "hi"}]).is_branch
    assert GenerateRequest(reply_prefix=[1, 2]).is_branch and GenerateRequest(forced=[3]).is_branch
    lanes = CompareRequest(lanes=[SamplingParams(temperature=0), SamplingParams(seed=1)])
    assert isinstance(lanes, PromptRequest) and lanes.model == "" and len(lanes.lanes) == 2
