"""The sampling panel and what it is built from."""
