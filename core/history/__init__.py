"""Conversations: the SQLite message tree, partial replies, export and import."""
