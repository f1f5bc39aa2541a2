"""Dialogs: opening a model and its facts (``model_dialog``), Connect to Server
(``server_dialog``, the view; ``servers``, the saved servers and the controller that calls them)."""
