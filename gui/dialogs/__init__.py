"""Dialogs: model info and loading, servers."""
