"""The chat room: transcript, prompt editor, one reply's life, conversation models."""
