"""core.library.checksums: the Hub's two checksums, computed as a download is written."""
import hashlib
import shutil
import subprocess

import pytest

from core.library.checksums import CHUNK, StreamHasher, git_blob_sha1


def test_git_blob_sha1_is_gits_own(tmp_path):
    f = tmp_path / "config.json"
    f.write_bytes(b'{"hello": "world"}\n')
    want = hashlib.sha1(b"blob 19\0" + f.read_bytes()).hexdigest()
    assert git_blob_sha1(f) == want
    if shutil.which("git"):
        assert git_blob_sha1(f) == subprocess.run(["git", "hash-object", str(f)], capture_output=True,
                                                  text=True, check=True).stdout.strip()


@pytest.mark.parametrize("have", [0, 5, CHUNK + 3])
def test_stream_hasher_resumes_from_the_partial_file(tmp_path, have):
    data = bytes(range(256)) * ((2 * CHUNK) // 256 + 1)
    part = tmp_path / "x.part"
    part.write_bytes(data[:have])
    h = StreamHasher()
    h.feed(b"thrown away: a restart starts over")
    h.restart(part, have, lambda: None)
    assert h.fed == have
    for i in range(have, len(data), 4096):
        h.feed(data[i:i + 4096])
    assert h.fed == len(data) and h.hexdigest() == hashlib.sha256(data).hexdigest()
