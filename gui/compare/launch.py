"""How the main window opens a comparison: a :class:`CompareView` seeded from its prompt
editor, sampling panel, conversation and server (the main window owns and shows it)."""
from __future__ import annotations

from PySide6.QtCore import Qt

from gui.compare import grounding
from gui.compare.view import CompareView
from gui.dialogs.server_dialog import ServerDialog


def _server_dialog_factory(window):
    """The app's Connect to Server dialog for "Model on a server…" (None without saved servers)."""
    saved = getattr(window, "servers", None)
    if saved is None:
        return None
    return lambda parent: ServerDialog(saved=saved, parent=parent)


def compare_window_for(window) -> CompareView:
    """A new comparison window for a :class:`gui.main_window.MainWindow`, which owns it
    (:meth:`MainWindow.open_compare` shows it, or raises the one already open).

    Seeds it with the prompt editor's text (or, when that is empty, the open conversation
    as context), the sampling panel's settings as the first lane, and the panel's chat
    format; "Adopt" writes through the window's conversation model, and clears the
    prompt editor when the adopted prompt came from it.
    """
    grounding.SOURCE = window.chats.attachments  # lanes can be grounded in the chat's files and collections
    panel = window.panel
    text = window.prompt.text()
    system = panel.system_prompt()
    conv = window.conversation
    context = conv.request_messages(system) if conv.conv_id is not None else (
        [{"role": "system", "content": system}] if system.strip() else [])
    view = CompareView(bridge=window.bridge, history=window.history, prompt=text, messages=context,
                       lanes=[panel.params()], mode="chat", chat_format=panel.chat_format(),
                       conversation=conv, server_dialog=_server_dialog_factory(window), parent=window,
                       tools=[t.to_openai() for t in window.chats.tools.tools()])
    backend = getattr(window, "backend", None)
    if backend is not None:  # replies come from a server: so does the first lane
        view.set_lane_model(0, view.add_server(backend))
    view.setWindowFlag(Qt.Window, True)  # its own window, closed with the main one
    view.setAttribute(Qt.WA_DeleteOnClose, True)

    def adopted(_text: str, _info: dict) -> None:
        prompt = (view.last_prompt or {}).get("text", "")
        if prompt.strip() and window.prompt.text().strip() == prompt.strip():
            window.prompt.clear()

    view.adoptRequested.connect(adopted)
    return view
