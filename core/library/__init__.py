"""The models folder, the Hugging Face Hub and resumable verified downloads."""
