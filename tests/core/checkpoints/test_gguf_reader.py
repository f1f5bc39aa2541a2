"""core.checkpoints.gguf_reader: gguf's reader made fast (metadata arrays in bulk) and
strict (a damaged file is said in the user's words, never in the library's)."""
import gguf
import numpy as np
import pytest

from core.checkpoints import load
from core.checkpoints.gguf_reader import Metadata, open_reader
from core.errors import CheckpointError


def test_bulk_metadata_reader_equals_gguf_reader(tmp_path, fixtures):
    """Our bulk array reading returns exactly what gguf's element-by-element reader does."""
    path = tmp_path / "meta.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_array("t.strings", ["a", "", "ünï", "日本", "▁x", "<0x0A>"])
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, -1.25])
    w.add_array("t.bools", [True, False])
    w.add_string("t.string", "hello")
    w.add_uint32("t.u32", 7)
    w.add_tensor("x", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for f in (path, fixtures / "stories260K.gguf"):
        ref = gguf.GGUFReader(str(f))
        md = Metadata(open_reader(f), f)
        assert md.values, "arrays were not read in bulk"
        for key, field in ref.fields.items():
            want = field.contents()
            got = md.get(key)
            assert (list(got) if isinstance(want, list) else got) == want, key


# --------------------------------------------------------------------------- damaged files, in the user's words

RAW_LIBRARY_TEXT = ("appears to be version", "we cannot handle", "buffer", "Traceback", "struct", "numpy", "index")


def _load_error(path) -> str:
    with pytest.raises(CheckpointError) as err:
        load(path, device="cpu", dtype="float32")
    msg = str(err.value)
    assert not any(raw in msg for raw in RAW_LIBRARY_TEXT), msg
    return msg


def test_corrupt_version_field_is_reported_as_a_damaged_file(tmp_path, fixtures):
    data = bytearray((fixtures / "stories260K.gguf").read_bytes())
    data[4:8] = (3990784546).to_bytes(4, "little")  # the value a user saw
    bad = tmp_path / "model.gguf"
    bad.write_bytes(bytes(data))
    msg = _load_error(bad)
    assert "damaged" in msg and "not fully downloaded" in msg and str(bad) in msg


def test_unsupported_versions_say_which_and_what_to_do(tmp_path, fixtures):
    data = bytearray((fixtures / "stories260K.gguf").read_bytes())
    for version, words in [(1, "too old"), (4, "newer than this app reads")]:
        data[4:8] = version.to_bytes(4, "little")
        bad = tmp_path / f"v{version}.gguf"
        bad.write_bytes(bytes(data))
        msg = _load_error(bad)
        assert f"GGUF version {version}" in msg and words in msg


def test_garbled_metadata_is_reported_as_a_damaged_file(tmp_path, fixtures):
    data = bytearray((fixtures / "stories260K.gguf").read_bytes())
    data[24:32] = b"\xff" * 8  # the first key's length: far past the end of the file
    bad = tmp_path / "garbled.gguf"
    bad.write_bytes(bytes(data))
    assert "damaged" in _load_error(bad)
