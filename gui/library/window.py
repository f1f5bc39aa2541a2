"""Model → Library…: the models on this machine, the Hugging Face Hub and the downloads, in one window.

:class:`LibraryRoom` is what the main window owns: the :class:`~gui.library.service.LibraryService`
(as long-lived as the app) and the :class:`LibraryWindow`, built when first shown. The
window's tabs are views over the service: :mod:`gui.library.library_view`,
:mod:`gui.library.hub_browser`, :mod:`gui.library.downloads_view`.
"""
from __future__ import annotations

from PySide6.QtCore import QObject, QSettings, Qt, Signal
from PySide6.QtWidgets import QTabWidget, QVBoxLayout, QWidget

from gui.library.downloads_view import DownloadsView
from gui.library.hub_browser import HubBrowser
from gui.library.library_view import LibraryView
from gui.library.service import LibraryService


class LibraryWindow(QWidget):
    """Model → Library… (objectName ``libraryWindow``): tabs Library, Hub and Downloads.

    Signals:
        openRequested(str): a model path to load in the main window.
    """

    openRequested = Signal(str)

    def __init__(self, service: LibraryService, parent=None):
        super().__init__(parent, Qt.Window)
        self.service = service
        self.setObjectName("libraryWindow")
        self.setAccessibleName("Model library")
        self.setWindowTitle("Model Library — LlamaDesk")
        lay = QVBoxLayout(self)
        self.tabs = QTabWidget()
        self.tabs.setObjectName("libraryTabs")
        self.library = LibraryView(service)
        self.hub = HubBrowser(service)
        self.downloads = DownloadsView(service)
        self.tabs.addTab(self.library, "Library")
        self.tabs.addTab(self.hub, "Hub")
        self.tabs.addTab(self.downloads, "Downloads")
        lay.addWidget(self.tabs)
        self.library.openRequested.connect(self.openRequested)
        self.downloads.openRequested.connect(self.openRequested)
        self.library.hubRequested.connect(lambda: self.show_tab("hub"))
        self.hub.downloadStarted.connect(lambda *_: self.show_tab("downloads"))
        self.resize(980, 620)

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt API)
        self.hub.close_down()
        super().closeEvent(event)

    def show_tab(self, name: str) -> None:
        self.tabs.setCurrentWidget({"library": self.library, "hub": self.hub, "downloads": self.downloads}[name])


class LibraryRoom(QObject):
    """The main window's library: its service (as long-lived as the window) and the library
    window, built on the first :meth:`show`. The main window owns one and calls it; nothing
    here touches the main window. ``models`` (a :class:`~gui.model_controller.ModelController`):
    the models it loads are recorded as used.

    Signals:
        openRequested(str): a model path chosen in the library window, to load.
    """

    openRequested = Signal(str)

    def __init__(self, parent_window: QWidget, *, settings: QSettings, models=None):
        super().__init__(parent_window)
        self.parent_window = parent_window
        self.service = LibraryService(settings=settings, parent=self)
        self.window: LibraryWindow | None = None
        if models is not None:
            # Every way a model is opened (File → Open, Recent, a drop, the command line, this
            # window) ends in the model controller's load: its success is the model's "last use".
            models.loaded.connect(self._on_loaded)

    def _on_loaded(self, info: dict) -> None:
        self.service.record_used((info or {}).get("path"))

    def resume_downloads(self) -> str | None:
        """Go on with downloads a previous run left; the reason in words when they could not."""
        try:
            self.service.resume_pending()
        except Exception as e:  # a damaged state file must not stop the app from starting
            return f"Downloads could not be resumed: {e}"
        return None

    def show(self, tab: str = "library") -> LibraryWindow:
        """Open (or raise) the library window on ``tab``; the first open scans."""
        if self.window is None:
            self.window = LibraryWindow(self.service, parent=self.parent_window)
            self.window.openRequested.connect(self.openRequested)
            self.service.rescan()
        self.window.show_tab(tab)
        self.window.show()
        self.window.raise_()
        self.window.activateWindow()
        return self.window

    def close(self) -> None:
        """Close the library window and stop the service's scans and downloads (app closing)."""
        if self.window is not None:
            self.window.close()
        self.service.shutdown()
