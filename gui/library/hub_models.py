"""The Hub tab's models and words: search results, a repository's files grouped by
quantization (with what each needs in memory and whether it fits), and hub errors in plain words."""
from __future__ import annotations

import datetime as _dt

from PySide6.QtCore import QAbstractTableModel, QModelIndex, Qt
from PySide6.QtGui import QBrush, QColor, QFont, QStandardItem, QStandardItemModel

from core.library.library import human_size
from gui import theme

FILE_ROLE = Qt.UserRole + 1   # a file row's HubFile
REPO_ROLE = Qt.UserRole + 1   # a search row's RepoSummary
UNNAMED = "Quantization not in the name"  # core.library.hub reads it from file names (Q4_K_M, Q8_0, F16…)


def date_text(v) -> str:
    if v in (None, ""):
        return "—"
    if isinstance(v, _dt.datetime):
        return v.strftime("%Y-%m-%d")
    return str(v)[:10]


def access_text(gated) -> str:
    """A repository's access in words: public, or gated (and how access is granted)."""
    if not gated:
        return "Public"
    if gated == "manual":
        return "Gated (owner approves)"
    return "Gated (accept license)"


def explain(err: Exception, *, token_given: bool = False, endpoint: str | None = None) -> tuple[str, str]:
    """(kind, plain words) for a hub error (core.errors.HubError's ``kind``): 'auth' when a
    token is needed, 'forbidden' when the token given has no access, 'not_found',
    'network', or the error's own kind with its message."""
    kind = getattr(err, "kind", None) or ("network" if isinstance(err, (ConnectionError, TimeoutError)) else "hub")
    detail = str(err) or type(err).__name__
    if kind == "auth" and not token_given:
        return "auth", ("This repository is gated or private, so the Hub wants to know who is asking. Open its "
                        "page on huggingface.co, accept the license there, create an access token (your "
                        "account → Settings → Access Tokens; “Read” is enough) and paste it here.")
    if kind == "auth":
        return "forbidden", ("The Hub refused this token for this repository: it is not valid, or its account has "
                             "not been given access yet (accept the license on the repository's page, or wait "
                             "for the owner to approve you). Paste another token to try again.")
    if kind == "not_found":
        return "not_found", f"Not on the Hub: {detail}. It may have been renamed, deleted or made private."
    if kind == "network":
        # The reason (no name lookup, refused, no answer in 3 s) tells offline from a Hub outage.
        reason = detail.removesuffix(": check the network connection").rstrip(".")
        if "cannot reach the" not in reason:
            reason = f"cannot reach the Hub at {endpoint or 'huggingface.co'}: {reason}"
        return "network", f"{reason[:1].upper()}{reason[1:]}. Check the network connection, then Retry."
    return kind, detail


# ---------------------------------------------------------------------------- search results
SEARCH_COLUMNS = ("Repository", "Downloads", "Likes", "Updated", "License", "Access", "Formats")


class HubSearchModel(QAbstractTableModel):
    """Search results, one repository a row (REPO_ROLE: its RepoSummary)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.repos: list = []

    def set_repos(self, repos: list) -> None:
        self.beginResetModel()
        self.repos = list(repos)
        self.endResetModel()

    def rowCount(self, parent=QModelIndex()) -> int:  # noqa: N802 (Qt API)
        return 0 if parent.isValid() else len(self.repos)

    def columnCount(self, parent=QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(SEARCH_COLUMNS)

    def headerData(self, section, orientation, role=Qt.DisplayRole):  # noqa: N802
        if orientation == Qt.Horizontal and role == Qt.DisplayRole:
            return SEARCH_COLUMNS[section]
        return None

    def data(self, index, role=Qt.DisplayRole):
        if not index.isValid():
            return None
        r = self.repos[index.row()]
        c = index.column()
        if role == REPO_ROLE:
            return r
        if role == Qt.DisplayRole:
            return (r.repo_id, f"{r.downloads or 0:,}", f"{r.likes or 0:,}", date_text(r.last_modified),
                    r.license or "—", access_text(r.gated), ", ".join(r.formats or ()) or "—")[c]
        if role == Qt.TextAlignmentRole and c in (1, 2):
            return int(Qt.AlignRight | Qt.AlignVCenter)
        if role == Qt.ToolTipRole and c == 5 and r.gated:
            return "Downloading needs a Hugging Face token of an account that accepted the license."
        return None


# ---------------------------------------------------------------------------- repository files
FILE_COLUMNS = ("File", "Size", "Memory needed", "Fits this machine")


class RepoFilesModel(QStandardItemModel):
    """A repository's loadable files grouped by quantization (FILE_ROLE on file rows).

    ``fits`` maps file path -> FitEstimate; ``recommended`` is the recommended file's path.
    """

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setHorizontalHeaderLabels(list(FILE_COLUMNS))
        self.files: list = []
        self.fits: dict = {}
        self.recommended: str | None = None

    def set_files(self, files: list, fits: dict | None = None, recommended: str | None = None,
                  failed: dict | None = None) -> None:
        """Show ``files`` grouped by quantization; ``failed`` maps a path to why it has no estimate."""
        self.files, self.fits, self.recommended = list(files), dict(fits or {}), recommended
        failed = failed or {}
        self.removeRows(0, self.rowCount())
        groups: dict[str, list] = {}
        for f in self.files:
            groups.setdefault(f.quant or UNNAMED, []).append(f)
        for quant, members in groups.items():
            head = self._group_row(quant, members)
            for f in members:
                head[0].appendRow(self._file_row(f, failed))
            self.appendRow(head)

    @staticmethod
    def _bold() -> QFont:
        bold = QFont()
        bold.setBold(True)
        return bold

    def _group_row(self, quant: str, members: list) -> list[QStandardItem]:
        total = sum(f.size or 0 for f in members)
        head = [QStandardItem(quant), QStandardItem(human_size(total)), QStandardItem(""), QStandardItem("")]
        for it in head:
            it.setEditable(False)
            it.setFont(self._bold())
        return head

    def _file_row(self, f, failed: dict) -> list[QStandardItem]:
        est = self.fits.get(f.path)
        label = f.path if f.kind == "gguf" else f"{f.name} (safetensors folder, {len(f.files)} files)"
        row = [QStandardItem(label), QStandardItem(human_size(f.size)),
               QStandardItem(human_size(est.total_bytes) if est else ("?" if f.path in failed else "…")),
               QStandardItem("cannot be estimated" if f.path in failed else self.fit_text(est))]
        row[0].setData(f, FILE_ROLE)
        row[0].setToolTip("\n".join(f.files) if f.files else f.path)
        if est is not None:
            row[2].setToolTip(f"weights {human_size(est.weights_bytes)} as held ({est.dtype}) + KV cache "
                              f"{human_size(est.kv_bytes)} at {est.context_length:,} tokens, on {est.device}")
        if f.path in failed:
            row[3].setToolTip(failed[f.path])
        for it in row:
            it.setEditable(False)
        if f.path == self.recommended:
            accent = QColor(theme.colors()["accent"])
            accent.setAlpha(60)
            row[3].setText("★ Recommended · " + row[3].text())
            for it in row:
                it.setBackground(QBrush(accent))
                it.setFont(self._bold())
        return row

    @staticmethod
    def fit_text(est) -> str:
        if est is None:
            return ""
        return "✓ fits" if est.fits else "✗ too large"

    def file_rows(self) -> list[tuple[QModelIndex, object]]:
        """(index of column 0, HubFile) for every file row, in order."""
        out = []
        for g in range(self.rowCount()):
            head = self.index(g, 0)
            for r in range(self.rowCount(head)):
                i = self.index(r, 0, head)
                out.append((i, i.data(FILE_ROLE)))
        return out
