"""The comparison window: lanes side by side, their runs and records."""
