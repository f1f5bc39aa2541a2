"""The main window's commands as one table: menus, toolbar and shortcuts are built from it.

Each row names a command once: its text, keys, icon, the window method it calls and the
menu it sits in. The README's key table is tested against :data:`ACTIONS`, so a shortcut
added here and not documented there (or the other way round) fails a test.
"""
from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

from PySide6.QtCore import QSize
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QMainWindow, QMenu, QSizePolicy, QToolBar, QWidget

from gui import theme

@dataclass(frozen=True)
class Action:
    """One command.

    ``slot`` is the window's method (a dotted path such as ``prompt.submit`` reaches a
    child) called with ``args`` when triggered, or with the new state when ``checkable``.
    ``menu`` is the top-level menu it sits in ("" for the toolbar alone).
    """
    name: str
    text: str
    slot: str
    menu: str
    shortcut: tuple = ()
    icon: str | None = None
    object_name: str = ""
    tip: str = ""
    args: tuple = ()
    checkable: bool = False
    checked: bool = False
    enabled: bool = True
    quit_role: bool = False


@dataclass(frozen=True)
class Submenu:
    """A menu whose entries the window makes: ``fill`` is its method taking the QMenu;
    ``refill``: filled again each time the menu opens (Recent Models)."""
    name: str
    text: str
    menu: str
    fill: str
    object_name: str = ""
    refill: bool = False


@dataclass(frozen=True)
class Separator:
    menu: str


MENUS = ("&File", "&Edit", "&Chat", "&Documents", "&Model", "&Tools", "&View")
FILE, EDIT, CHAT, DOCS, MODEL, TOOLS, VIEW = MENUS

RECORD_PROBS_TIP = "Keep each token's probability and alternatives with new replies, for the token inspector"

ACTIONS: tuple[Action | Submenu | Separator, ...] = (
    Action("new", "&New Chat", "new_chat", FILE, (QKeySequence.New,), "new", "newChatAction"),
    Action("open", "&Open Model…", "open_model_dialog", FILE, (QKeySequence.Open,), "open", "openModelAction",
           tip="Open a .gguf file or a model folder (Ctrl+O)"),
    Submenu("recent", "Recent &Models", FILE, "fill_recent", "recentMenu", refill=True),
    Separator(FILE),
    Action("import", "&Import Conversation (JSON)…", "import_conversation", FILE, icon="import"),
    Action("export_md", "Export as &Markdown…", "export_conversation", FILE, icon="export", args=("md",)),
    Action("export_json", "Export as &JSON…", "export_conversation", FILE, args=("json",)),
    Separator(FILE),
    Action("quit", "&Quit", "close", FILE, ("Ctrl+Q",), object_name="quitAction", quit_role=True),

    Action("copy_last", "&Copy Last Reply", "copy_last_reply", EDIT, ("Ctrl+Shift+C",), "copy"),
    Action("focus", "&Focus Prompt", "prompt.focus", EDIT, ("Ctrl+L",)),

    Action("send", "&Send", "prompt.submit", CHAT, ("Ctrl+Return", "Ctrl+Enter"), "send"),
    Action("stop", "S&top", "stop", CHAT, ("Esc",), "stop", "stopAction"),
    Action("regen", "&Regenerate Reply", "chats.regenerate", CHAT, ("Ctrl+R",), "regenerate"),
    Action("continue", "C&ontinue Reply", "chats.continue_reply", CHAT, icon="continue"),
    Separator(CHAT),
    Action("rename", "Re&name Chat", "sidebar.rename_current", CHAT, ("F2",)),
    Action("delete_chat", "&Delete Chat", "delete_current", CHAT, icon="delete"),

    Action("attach", "&Attach Files…", "attach_bar.choose", DOCS, icon="attach", object_name="attachAction",
           tip="Attach files to the next message (or drop them on the chat, or paste them)"),
    Action("collections", "&Collections…", "attach_bar.manage", DOCS, object_name="collectionsAction",
           tip="Folders indexed once and kept current, to search from a message"),

    Action("library", "&Library…", "open_library", MODEL, object_name="libraryAction",
           tip="Models on this machine, the Hugging Face Hub, downloads"),
    Action("connect", "Connect to &Server…", "open_server_dialog", MODEL, object_name="connectServerAction",
           tip="Chat with a model on an OpenAI-compatible server"),
    Action("use_local", "Use &Local Model", "use_local", MODEL, object_name="useLocalAction",
           tip="Replies come from the model loaded on this computer again", enabled=False),
    Separator(MODEL),
    Submenu("device", "&Device", MODEL, "fill_devices"),
    Submenu("dtype", "Data &Type", MODEL, "fill_dtypes"),
    Action("compile", "&Compile Decoding (torch.compile)", "models.set_compile", MODEL, object_name="compileDecode",
           tip="Decode through torch.compile: CUDA graphs on a GPU, C++ kernels on the CPU "
               "(the first reply waits for the compiler; eager if it fails)", checkable=True),
    Action("reload", "&Reload Model", "models.reload", MODEL),
    Action("unload", "&Unload Model", "unload_model", MODEL),
    Action("info", "Model &Info…", "show_model_info", MODEL, ("Ctrl+I",)),

    # Tools the model may call (issue 25): gui/chat/tools_menu.py fills these.
    Submenu("chat_tools", "&Enable in This Chat", TOOLS, "tools_menu.fill_chat", "chatToolsMenu", refill=True),
    Submenu("mcp_prompts", "Insert MCP &Prompt", TOOLS, "tools_menu.fill_prompts", "mcpPromptsMenu", refill=True),
    Submenu("mcp_resources", "Attach MCP &Resource", TOOLS, "tools_menu.fill_resources", "mcpResourcesMenu",
            refill=True),
    Separator(TOOLS),
    Submenu("tool_options", "&Options", TOOLS, "tools_menu.fill_options", "toolOptionsMenu", refill=True),
    Action("mcp_servers", "&MCP Servers…", "tools_menu.open_servers", TOOLS, object_name="mcpServersAction",
           tip="Add, edit and check the MCP servers that give the model tools"),

    Action("toggle_list", "&Conversations", "show_conversations", VIEW, ("Ctrl+Shift+L",),
           checkable=True, checked=True),
    Action("toggle_panel", "&Settings Panel", "show_settings_panel", VIEW, ("Ctrl+Shift+S",), "settings",
           checkable=True, checked=True),
    Separator(VIEW),
    # Replies keep each token's probability and top alternatives (for "Inspect tokens");
    # off: nothing is recorded and the worker skips the extra work. Off by default: the
    # records are ~200 KB a reply in the history and in exports, for a debugging view.
    Action("record_probs", "&Record Token Probabilities", "set_record_probs", VIEW, object_name="recordProbsAction",
           tip=RECORD_PROBS_TIP, checkable=True),
    Submenu("theme", "&Theme", VIEW, "fill_themes"),

    # The side-by-side comparison window (gui/compare/view.py): on the toolbar only.
    Action("compare", "Compare Settings…", "open_compare", "", ("Ctrl+Shift+K",), "compare", "compareButton",
           tip="Compare sampling settings side by side (Ctrl+Shift+K)"),
)

STRETCH = "stretch"
TOOLBAR = ("new", "open", "-", "regen", "compare", STRETCH, "toggle_panel")
NAMED_BUTTONS = ("compare",)  # toolbar buttons found by objectName (the action's)


def key_sequences(row: Action) -> list[QKeySequence]:
    """The row's shortcuts as key sequences (a standard key: its platform's first binding)."""
    return [QKeySequence(key) for key in row.shortcut]


def build(window: QMainWindow, *, checked: dict[str, bool] | None = None
          ) -> tuple[dict[str, QAction], dict[str, QMenu], QToolBar]:
    """Make the table's actions, menus and toolbar on ``window``.

    ``checked`` overrides a checkable row's starting state (without calling its slot).
    Returns the actions and the submenus by name, and the toolbar.
    """
    checked = checked or {}
    menus = {title: window.menuBar().addMenu(title) for title in MENUS}
    actions: dict[str, QAction] = {}
    submenus: dict[str, QMenu] = {}
    for row in ACTIONS:
        if isinstance(row, Separator):
            menus[row.menu].addSeparator()
        elif isinstance(row, Submenu):
            submenus[row.name] = _submenu(window, menus[row.menu], row)
        else:
            actions[row.name] = a = _action(window, row, checked.get(row.name, row.checked))
            if row.menu:
                menus[row.menu].addAction(a)
    return actions, submenus, _toolbar(window, actions)


def _action(window: QMainWindow, row: Action, checked: bool) -> QAction:
    a = QAction(row.text, window)
    a.setShortcuts(key_sequences(row))
    if row.icon:
        a.setIcon(theme.icon(row.icon))
    if row.object_name:
        a.setObjectName(row.object_name)
    if row.tip:
        a.setToolTip(row.tip)
    if row.quit_role:
        a.setMenuRole(QAction.QuitRole)
    a.setEnabled(row.enabled)
    slot = attrgetter(row.slot)(window)
    if row.checkable:
        a.setCheckable(True)
        a.setChecked(checked)
        a.toggled.connect(slot)
    else:
        a.triggered.connect(lambda _checked=False: slot(*row.args))
    window.addAction(a)  # shortcuts work even with the menu bar hidden
    return a


def _submenu(window: QMainWindow, parent: QMenu, row: Submenu) -> QMenu:
    menu = parent.addMenu(row.text)
    if row.object_name:
        menu.setObjectName(row.object_name)
    fill = attrgetter(row.fill)(window)
    if row.refill:
        menu.aboutToShow.connect(lambda: fill(menu))
    fill(menu)
    return menu


def _toolbar(window: QMainWindow, actions: dict[str, QAction]) -> QToolBar:
    tb = window.addToolBar("Main")
    tb.setObjectName("mainToolBar")
    tb.setMovable(False)
    tb.setIconSize(QSize(18, 18))
    for name in TOOLBAR:
        if name == "-":
            tb.addSeparator()
        elif name == STRETCH:
            spacer = QWidget()
            spacer.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Preferred)
            tb.addWidget(spacer)
        else:
            tb.addAction(actions[name])
            if name in NAMED_BUTTONS:
                tb.widgetForAction(actions[name]).setObjectName(actions[name].objectName())
    return tb


def fill_choices(menu: QMenu, choices, current, pick, *, name: str = "", label=str) -> None:
    """Fill ``menu`` with one checkable entry per choice, ``current`` checked; choosing one
    calls ``pick(choice)``. ``name``: entries are found as ``{name}_{choice}``."""
    group = QActionGroup(menu)
    for choice in choices:
        a = menu.addAction(label(choice))
        a.setCheckable(True)
        a.setChecked(choice == current)
        if name:
            a.setObjectName(f"{name}_{choice}")
        group.addAction(a)
        a.triggered.connect(lambda _checked=False, choice=choice: pick(choice))


def fill_recent(menu: QMenu, paths: list[str], load, clear) -> None:
    """File → Recent Models: one entry per path (``load(path)``), and Clear (``clear()``)."""
    menu.clear()
    for p in paths:
        a = menu.addAction(p)
        a.triggered.connect(lambda _checked=False, p=p: load(p))
    if paths:
        menu.addSeparator()
        menu.addAction("Clear Recent Models", clear)
    else:
        menu.addAction("No recent models").setEnabled(False)


def icons() -> dict[str, str]:
    """Each action's icon name, to tint them again when the theme changes."""
    return {row.name: row.icon for row in ACTIONS if isinstance(row, Action) and row.icon}
