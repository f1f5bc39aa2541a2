"""Real documents written in the tests: PDFs by fpdf2, .docx by python-docx."""
from pathlib import Path

import pytest

from core.documents.index import DocumentIndex


def write_pdf(path: Path, pages: list[str], *, user_password: str | None = None) -> Path:
    """A PDF with one page per string (an empty string: a page with no text layer)."""
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_font("helvetica", size=11)
    for text in pages:
        pdf.add_page()
        if text:
            pdf.multi_cell(0, 6, text)
        else:
            pdf.rect(20, 20, 100, 60, style="F")  # a "scan": drawn, no text
    if user_password is not None:
        pdf.set_encryption(owner_password="owner", user_password=user_password)
    pdf.output(str(path))
    return path


def write_docx(path: Path, parts: list[tuple[str, str]]) -> Path:
    """A .docx of (style, text): style 'h1'/'h2' for headings, '' for a paragraph."""
    import docx

    d = docx.Document()
    for style, text in parts:
        if style.startswith("h"):
            d.add_heading(text, level=int(style[1:]))
        else:
            d.add_paragraph(text)
    d.save(str(path))
    return path


@pytest.fixture
def ix(tmp_path):
    index = DocumentIndex(tmp_path / "data" / "history.sqlite3")
    yield index
    index.close()
