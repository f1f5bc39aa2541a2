"""The models folder, the Hugging Face Hub and resumable verified downloads.

library (scan, entries, LibraryState) · hub (HubClient: search, files, fit) · downloads
(DownloadManager: the queue) · checksums (sha256 while writing, git blob ids).
"""
