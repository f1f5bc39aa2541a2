"""Reading documents: encodings, binaries, PDFs (text layer, scanned, encrypted, bombs),
.docx and HTML, and the size limits checked before reading."""
import codecs
import time

import pytest

from core import limits
from core.documents.extract import DocumentError, decode_text, extract, kind_of
from tests.core.documents.conftest import write_docx, write_pdf


def test_utf8_text_and_its_hash(tmp_path):
    p = tmp_path / "notes.txt"
    p.write_bytes("Grüße\r\nline two\n".encode())
    doc = extract(p)
    assert doc.kind == "text" and doc.text == "Grüße\nline two\n" and doc.notes == []
    import hashlib
    assert doc.sha256 == hashlib.sha256(p.read_bytes()).hexdigest() and doc.size == p.stat().st_size


@pytest.mark.parametrize("bom,enc", [(codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"),
                                     (codecs.BOM_UTF8, "utf-8")])
def test_byte_order_marks(tmp_path, bom, enc):
    p = tmp_path / "u.md"
    p.write_bytes(bom + "# Título\n\ncafé".encode(enc))
    doc = extract(p)
    assert doc.text == "# Título\n\ncafé" and doc.kind == "markdown" and not doc.notes


def test_invalid_utf8_is_replaced_and_said(tmp_path):
    p = tmp_path / "bad.txt"
    p.write_bytes(b"good start \xff\xfe middle \xc3 end")
    doc = extract(p)
    assert "\ufffd" in doc.text and doc.text.startswith("good start ") and doc.text.endswith(" end")
    assert len(doc.notes) == 1 and "offset 11" in doc.notes[0]


def test_binary_named_txt_is_refused(tmp_path):
    p = tmp_path / "photo.txt"
    p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 4)
    with pytest.raises(DocumentError, match="photo.txt: .*binary"):
        extract(p)
    q = tmp_path / "ctl.txt"
    q.write_bytes(bytes([1, 2, 3, 4, 5, 6, 7, 8]) * 50 + b"text")
    with pytest.raises(DocumentError, match="control codes"):
        extract(q)


def test_huge_file_refused_by_size_before_reading(tmp_path):
    p = tmp_path / "huge.txt"
    with open(p, "wb") as f:  # sparse: 2 GB on paper, nothing on disk
        f.truncate(2 << 30)
    t = time.perf_counter()
    with pytest.raises(DocumentError, match=r"2\.0 GiB, more than the 64\.0 MiB"):
        extract(p)
    assert time.perf_counter() - t < 0.2


def test_not_a_document_folder_and_missing(tmp_path):
    with pytest.raises(DocumentError, match="'.exe' files are not documents"):
        extract(tmp_path / "x.exe")
    (tmp_path / "d.txt").mkdir()
    with pytest.raises(DocumentError, match="folder"):
        extract(tmp_path / "d.txt")
    with pytest.raises(DocumentError, match="not found"):
        extract(tmp_path / "gone.md")
    assert kind_of("a/b/main.rs") == "code" and kind_of("README") == "text" and kind_of("x.bin") is None


def test_pdf_pages_and_a_scanned_page(tmp_path):
    p = write_pdf(tmp_path / "paper.pdf", ["Alpha page about llamas.", "", "Gamma page about alpacas."])
    doc = extract(p)
    assert doc.pages == 3 and [s.page for s in doc.sections] == [1, 3]
    assert "llamas" in doc.sections[0].text and "alpacas" in doc.sections[1].text
    assert doc.notes == ["1 of 3 pages have no text layer (scanned?): page 2"]


def test_scanned_pdf_without_text_says_so(tmp_path):
    p = write_pdf(tmp_path / "scan.pdf", ["", ""])
    with pytest.raises(DocumentError, match="scan.pdf: it has no text layer .*OCR"):
        extract(p)


def test_encrypted_pdf_is_refused_with_reason(tmp_path):
    p = write_pdf(tmp_path / "secret.pdf", ["classified"], user_password="pw")
    with pytest.raises(DocumentError, match="encrypted"):
        extract(p)


def test_pdf_over_the_page_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "MAX_PDF_PAGES", 3)
    p = write_pdf(tmp_path / "long.pdf", ["a", "b", "c", "d"])
    with pytest.raises(DocumentError, match="4 pages, more than the 3 read"):
        extract(p)


def _nested_pdf(depth: int) -> bytes:
    """A PDF whose page's resources nest ``depth`` arrays deep (a parser-recursion bomb)."""
    bomb = b"[" * depth + b"]" * depth
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /X " + bomb + b" >> >>"]
    out, offs = bytearray(b"%PDF-1.4\n"), []
    for i, o in enumerate(objs, 1):
        offs.append(len(out))
        out += b"%d 0 obj\n" % i + o + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offs)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    return bytes(out)


def test_pdf_bomb_nested_objects_is_refused_quickly(tmp_path):
    p = tmp_path / "bomb.pdf"
    p.write_bytes(_nested_pdf(50_000))
    t = time.perf_counter()
    with pytest.raises(DocumentError, match="bomb.pdf"):
        extract(p)
    assert time.perf_counter() - t < 2.0


def test_not_a_pdf(tmp_path):
    p = tmp_path / "fake.pdf"
    p.write_text("hello")
    with pytest.raises(DocumentError, match="not a PDF"):
        extract(p)


def test_docx_headings_paragraphs_tables(tmp_path):
    import docx
    p = write_docx(tmp_path / "r.docx", [("h1", "Results"), ("", "Llamas hum."), ("h2", "Details"), ("", "More.")])
    d = docx.Document(str(p))
    t = d.add_table(rows=1, cols=2)
    t.rows[0].cells[0].text, t.rows[0].cells[1].text = "k", "v"
    d.save(str(p))
    doc = extract(p)
    assert doc.text.startswith("# Results\n\nLlamas hum.\n\n## Details\n\nMore.") and "k | v" in doc.text


def test_docx_that_is_not_a_zip(tmp_path):
    p = tmp_path / "x.docx"
    p.write_text("plain")
    with pytest.raises(DocumentError, match="not a zip"):
        extract(p)


def test_html_text_and_headings(tmp_path):
    p = tmp_path / "page.html"
    p.write_text("<html><head><style>p{}</style><script>var x=1</script></head><body>"
                 "<h1>Title</h1><p>First <b>para</b>.</p><h2>Sub</h2><p>Second.</p></body></html>")
    doc = extract(p)
    assert "var x" not in doc.text and "p{}" not in doc.text
    assert doc.text == "# Title\n\nFirst para.\n\n## Sub\n\nSecond."


def test_utf16_without_bom_is_caught_as_binary(tmp_path):
    p = tmp_path / "w.txt"
    p.write_bytes("hello there".encode("utf-16-le"))
    assert decode_text(p.read_bytes())[1] is None  # valid UTF-8 with NULs: only the sniff can tell
    with pytest.raises(DocumentError, match="NUL"):
        extract(p)
