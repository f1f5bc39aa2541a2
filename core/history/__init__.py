"""Conversations: the SQLite message tree, partial replies, export and import.

store (History: the tree, one transaction per write) · schema (tables, migrations, tree
queries) · records (Conversation, Message, HistoryError; how values are stored) ·
partial (PartialReply: a streaming reply saved as it grows) · export (Markdown, JSON) ·
tool_messages (a reply's tool calls and their results as messages).
"""
