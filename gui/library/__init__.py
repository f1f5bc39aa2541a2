"""Model → Library…: the models on this machine, the Hugging Face Hub, downloads.

``window`` (LibraryRoom: what the main window owns; LibraryWindow: the three tabs) over
``service`` (LibraryService: folders, hub client, downloads, scans; one per app). Each tab is
a model, a controller without widgets, and a view that lays out and forwards:
``library_table`` / ``library_controller`` / ``library_view``, ``hub_models`` /
``hub_controller`` / ``hub_browser``, ``downloads_model`` / ``downloads_controller`` /
``downloads_view``.
"""
