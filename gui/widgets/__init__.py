"""Widgets shared by rooms: token inspector, notice bar."""
