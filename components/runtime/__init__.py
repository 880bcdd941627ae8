"""Execution backends (where forward passes run) and the private step loop."""
from components.runtime.local import LocalBackend
from components.runtime.loop import JournalEntry, PrivateLoop

__all__ = ["JournalEntry", "LocalBackend", "PrivateLoop"]
