"""Widgets shared by rooms: token inspector, notice bar, token runs (a lane's or a reply's
tokens and their HTML)."""
