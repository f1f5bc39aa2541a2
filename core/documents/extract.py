"""Text out of the files a user attaches: plain text and source code, Markdown, PDF (its
text layer, through pypdf), .docx (python-docx) and HTML (BeautifulSoup).

Every file is refused by size before a byte is read (limits in :mod:`core.limits`), text is
read streamed while it is hashed, and whatever cannot be read is a :class:`DocumentError`
with one line saying why (encrypted, no text layer, binary, nested too deeply...). What was
read with a caveat (invalid UTF-8 replaced, pages without text) is kept in ``notes``.
"""
from __future__ import annotations

import codecs
import hashlib
import io
import os
import re
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from core import limits
from core.errors import LlamaDeskError

__all__ = ["Document", "DocumentError", "Section", "extract", "file_sha256", "kind_of", "SUFFIX_KINDS"]

_CODE = (".py", ".pyi", ".c", ".h", ".cc", ".cpp", ".hpp", ".cxx", ".rs", ".go", ".java", ".kt", ".js", ".jsx",
         ".ts", ".tsx", ".rb", ".php", ".cs", ".swift", ".m", ".scala", ".sh", ".bash", ".zsh", ".ps1", ".sql",
         ".r", ".lua", ".pl", ".hs", ".ml", ".ex", ".exs", ".clj", ".dart", ".jl", ".toml", ".yaml", ".yml",
         ".json", ".ini", ".cfg", ".css", ".scss", ".xml", ".cmake", ".mk", ".tex", ".bib", ".proto")
#: suffix -> kind; a file with another suffix is not a document this app reads.
SUFFIX_KINDS: dict[str, str] = {
    ".txt": "text", ".text": "text", ".log": "text", ".csv": "text", ".tsv": "text", ".rst": "text",
    ".md": "markdown", ".markdown": "markdown",
    ".pdf": "pdf", ".docx": "docx", ".html": "html", ".htm": "html", ".xhtml": "html",
    **{s: "code" for s in _CODE},
}
_SPECIAL_NAMES = {"readme": "text", "license": "text", "makefile": "code", "dockerfile": "code"}
_READ_BLOCK = 1 << 20
_SNIFF = 8192
_HTML_BLOCKS = ["p", "div", "section", "article", "li", "tr", "table", "ul", "ol", "pre", "blockquote", "dt", "dd"]
_BINARY_CONTROL_RATIO = 0.10
_CONTROL_BYTES = bytes(c for c in range(32) if c not in (9, 10, 12, 13)) + b"\x7f"


class DocumentError(LlamaDeskError):
    """A file that cannot be read as a document; ``str()`` says which and why."""

    def __init__(self, message: str, *, path: str | os.PathLike | None = None):
        self.path = None if path is None else os.fspath(path)
        super().__init__(f"{Path(self.path).name}: {message}" if self.path else message)
        self.reason = message


@dataclass(frozen=True)
class Section:
    """A stretch of a document with where it starts: a PDF page, or the whole text of
    another kind (``page`` None, ``line`` the 1-based line it starts on)."""
    text: str
    page: int | None = None
    line: int = 1


@dataclass
class Document:
    """What :func:`extract` read from one file."""
    path: str
    kind: str  # text | markdown | code | pdf | docx | html
    sections: list[Section]
    size: int
    sha256: str
    notes: list[str] = field(default_factory=list)
    pages: int | None = None  # PDFs

    @property
    def name(self) -> str:
        return Path(self.path).name

    @property
    def text(self) -> str:
        return "\n\n".join(s.text for s in self.sections)


def kind_of(path: str | os.PathLike) -> str | None:
    """The document kind a file's name says, or None for a file this app does not read."""
    p = Path(path)
    return SUFFIX_KINDS.get(p.suffix.lower()) or (None if p.suffix else _SPECIAL_NAMES.get(p.name.lower()))


def extract(path: str | os.PathLike, *, kind: str | None = None) -> Document:
    """The text of ``path``; DocumentError (one line) when it cannot be read."""
    path = os.fspath(path)
    kind = kind or kind_of(path)
    if kind is None:
        raise DocumentError(f"'{Path(path).suffix or 'no suffix'}' files are not documents this app reads "
                            "(text, Markdown, source code, PDF, .docx, HTML)", path=path)
    reader = {"pdf": _read_pdf, "docx": _read_docx, "html": _read_html}.get(kind, _read_text)
    try:
        doc = reader(path, kind)
    except DocumentError:
        raise
    except RecursionError:
        raise DocumentError("its structure is nested too deeply to read (a malformed or hostile file)",
                            path=path) from None
    except MemoryError:
        raise DocumentError("it needs more memory to read than is free", path=path) from None
    except OSError as e:
        raise DocumentError(f"cannot read it: {e.strerror or e}", path=path) from None
    if sum(len(s.text) for s in doc.sections) > limits.MAX_DOCUMENT_CHARS:
        raise DocumentError(f"it holds more than {limits.MAX_DOCUMENT_CHARS:,} characters of text", path=path)
    return doc


# --------------------------------------------------------------------------- reading bytes

def file_sha256(path: str | os.PathLike) -> tuple[str, int]:
    """(SHA-256, size) of a file, read streamed, refused by size first as :func:`extract`
    would: whether this content was indexed before is known without parsing it."""
    path = os.fspath(path)
    limit = _limit_for(kind_of(path) or "text")
    h, n = hashlib.sha256(), 0
    with limits.opened_regular(path, error=DocumentError) as fd:
        size = os.fstat(fd).st_size
        if size > limit:
            raise DocumentError(f"it is {limits.human(size)}, more than the {limits.human(limit)} "
                                "a document of its kind may be", path=path)
        while True:
            b = os.read(fd, _READ_BLOCK)
            if not b:
                return h.hexdigest(), n
            h.update(b)
            n += len(b)


def _limit_for(kind: str) -> int:
    return {"pdf": limits.MAX_PDF_BYTES, "docx": limits.MAX_OFFICE_BYTES,
            "html": limits.MAX_HTML_BYTES}.get(kind, limits.MAX_TEXT_DOCUMENT_BYTES)


def _read_bytes(path: str, kind: str) -> tuple[bytes, str]:
    """The file's bytes and SHA-256, refused by size before reading, read in blocks."""
    limit = _limit_for(kind)
    with limits.opened_regular(path, error=DocumentError) as fd:
        size = os.fstat(fd).st_size
        if size > limit:
            raise DocumentError(f"it is {limits.human(size)}, more than the {limits.human(limit)} "
                                f"a {kind} document may be", path=path)
        h, parts, got = hashlib.sha256(), [], 0
        while True:
            b = os.read(fd, _READ_BLOCK)
            if not b:
                break
            got += len(b)
            if got > limit:
                raise DocumentError(f"it grew past {limits.human(limit)} while being read", path=path)
            h.update(b)
            parts.append(b)
    return b"".join(parts), h.hexdigest()


def _looks_binary(head: bytes) -> str | None:
    if not head:
        return None
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return None
    if b"\x00" in head:
        return "it holds NUL bytes: a binary file, not text"
    controls = len(head) - len(head.translate(None, _CONTROL_BYTES))
    if controls / len(head) > _BINARY_CONTROL_RATIO:
        return f"{controls * 100 // len(head)}% of its first bytes are control codes: a binary file, not text"
    return None


def decode_text(data: bytes) -> tuple[str, str | None]:
    """(text, note): UTF-8 (with or without BOM) or UTF-16 by its BOM; otherwise UTF-8 with
    invalid bytes replaced by U+FFFD and a note saying where the first one was."""
    if data.startswith(codecs.BOM_UTF8):
        data, enc = data[3:], "utf-8"
    elif data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        enc = "utf-16"
    else:
        enc = "utf-8"
    try:
        return data.decode(enc), None
    except UnicodeDecodeError as e:
        bad = e.start
        return data.decode(enc, "replace"), f"not valid {enc.upper()} (first bad byte at offset {bad}): " \
                                            "undecodable bytes were replaced by \ufffd"


def _read_text(path: str, kind: str) -> Document:
    data, digest = _read_bytes(path, kind)
    why = _looks_binary(data[:_SNIFF])
    if why:
        raise DocumentError(why, path=path)
    text, note = decode_text(data)
    del data
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return Document(path, kind, [Section(text)], size=os.path.getsize(path), sha256=digest,
                    notes=[note] if note else [])


# --------------------------------------------------------------------------- PDF

def _read_pdf(path: str, kind: str) -> Document:
    import pypdf  # why: a heavy import only PDFs need (the app starts without it)
    from pypdf.errors import FileNotDecryptedError, PdfReadError  # why: as above

    data, digest = _read_bytes(path, kind)
    if not data.lstrip()[:5].startswith(b"%PDF"):
        raise DocumentError("it is not a PDF (no %PDF header)", path=path)
    try:
        reader = pypdf.PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted:
            _decrypt(reader, path)
        n = len(reader.pages)
    except DocumentError:
        raise
    except FileNotDecryptedError:
        raise DocumentError("it is encrypted (password-protected); decrypt it first", path=path) from None
    except RecursionError:
        raise
    except (PdfReadError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        raise DocumentError(f"not a readable PDF ({type(e).__name__}: {e})", path=path) from None
    if n > limits.MAX_PDF_PAGES:
        raise DocumentError(f"it has {n:,} pages, more than the {limits.MAX_PDF_PAGES:,} read", path=path)
    sections, empty = _pdf_pages(reader, n, path)
    if n and not sections:
        raise DocumentError("it has no text layer (a scanned PDF?): there is no text to read "
                            "without OCR", path=path)
    notes = []
    if empty:
        notes.append(f"{len(empty)} of {n} pages have no text layer (scanned?): "
                     f"page{'s' if len(empty) > 1 else ''} {_ranges(empty)}")
    return Document(path, kind, sections, size=len(data), sha256=digest, notes=notes, pages=n)


def _decrypt(reader, path: str) -> None:
    # Many PDFs are "encrypted" with an empty user password (printing rights only).
    try:
        ok = reader.decrypt("")
    except Exception as e:  # noqa: BLE001 — pypdf raises several kinds (missing AES backend...)
        raise DocumentError(f"it is encrypted and cannot be opened ({type(e).__name__})", path=path) from None
    if not ok:
        raise DocumentError("it is encrypted (password-protected); decrypt it first", path=path)


def _pdf_pages(reader, n: int, path: str) -> tuple[list[Section], list[int]]:
    deadline = time.monotonic() + limits.MAX_PDF_SECONDS
    sections, empty, chars = [], [], 0
    for i in range(n):
        if time.monotonic() > deadline:
            raise DocumentError(f"reading it took more than {limits.MAX_PDF_SECONDS:g} s "
                                f"(stopped at page {i + 1} of {n})", path=path)
        try:
            text = reader.pages[i].extract_text() or ""
        except RecursionError:
            raise
        except Exception as e:  # noqa: BLE001 — one damaged page must not lose the others
            text = ""
            if not empty or empty[-1] != i + 1:
                empty.append(i + 1)
            del e
            continue
        text = _clean_pdf_text(text)
        chars += len(text)
        if chars > limits.MAX_DOCUMENT_CHARS:
            raise DocumentError(f"it holds more than {limits.MAX_DOCUMENT_CHARS:,} characters of text", path=path)
        if text.strip():
            sections.append(Section(text, page=i + 1))
        else:
            empty.append(i + 1)
    return sections, empty


def _clean_pdf_text(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    return re.sub(r"-\n(?=[a-z])", "", text)  # words hyphenated across lines


def _ranges(nums: list[int]) -> str:
    out, start = [], None
    for i, v in enumerate(nums):
        if start is None:
            start = v
        if i + 1 == len(nums) or nums[i + 1] != v + 1:
            out.append(str(start) if start == v else f"{start}-{v}")
            start = None
    text = ", ".join(out[:12])
    return text + (", …" if len(out) > 12 else "")


# --------------------------------------------------------------------------- .docx and HTML

def _read_docx(path: str, kind: str) -> Document:
    import docx  # why: python-docx loads lxml; only .docx files need it

    data, digest = _read_bytes(path, kind)
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            inflated = sum(i.file_size for i in z.infolist())
    except zipfile.BadZipFile:
        raise DocumentError("not a .docx file (not a zip archive)", path=path) from None
    if inflated > limits.MAX_OFFICE_BYTES:
        raise DocumentError(f"its parts inflate to {limits.human(inflated)}, more than the "
                            f"{limits.human(limits.MAX_OFFICE_BYTES)} read (a zip bomb?)", path=path)
    try:
        d = docx.Document(io.BytesIO(data))
    except Exception as e:  # noqa: BLE001 — python-docx raises KeyError, ValueError, lxml errors...
        raise DocumentError(f"not a readable .docx ({type(e).__name__})", path=path) from None
    lines = []
    for p in d.paragraphs:
        style = (p.style.name if p.style is not None else "") or ""
        m = re.match(r"(?:Heading|Title)\s*(\d*)", style)
        text = p.text.strip()
        if m and text:
            lines.append("#" * min(int(m.group(1) or 1), 6) + " " + text)
        elif text:
            lines.append(text)
    for t in d.tables:
        for row in t.rows:
            lines.append(" | ".join(c.text.strip() for c in row.cells))
        lines.append("")
    text = "\n\n".join(lines)
    return Document(path, kind, [Section(re.sub(r"\n{3,}", "\n\n", text))], size=len(data), sha256=digest)


def _read_html(path: str, kind: str) -> Document:
    from bs4 import BeautifulSoup  # why: only HTML files need it

    data, digest = _read_bytes(path, kind)
    why = _looks_binary(data[:_SNIFF])
    if why:
        raise DocumentError(why, path=path)
    soup = BeautifulSoup(data, "html.parser")
    for tag in soup(["script", "style", "noscript", "template"]):
        tag.decompose()
    for level in range(1, 7):  # headings as Markdown, so chunks split along them
        for h in soup.find_all(f"h{level}"):
            h.replace_with(f"\n\n{'#' * level} {h.get_text(' ', strip=True)}\n\n")
    for tag in soup.find_all(_HTML_BLOCKS):  # blocks end lines; inline tags (<b>, <a>) do not
        tag.append("\n\n" if tag.name in ("p", "div", "section", "article", "table", "ul", "ol", "pre") else "\n")
    for br in soup.find_all("br"):
        br.replace_with("\n")
    text = soup.get_text()
    text = re.sub(r"[ \t]+\n", "\n", re.sub(r"[ \t]+", " ", text))
    text = re.sub(r"\n{3,}", "\n\n", text).strip()
    return Document(path, kind, [Section(text)], size=len(data), sha256=digest)
