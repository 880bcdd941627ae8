"""What a runtime's workers can fail with before any work reaches them (no Ray import: callers catch it
without starting Ray)."""
from __future__ import annotations

from specs.refusal import RuntimeRefusal


class WorkersNotReady(RuntimeRefusal):
    """Ray's workers cannot run privzo's code (another package of that name first on their path, a node
    without privzo): found before any row was sent to them."""


class DataChanged(RuntimeError):
    """A worker's private rows differ from the driver's (a replica's, or a search's task's): indices or a
    trajectory computed on them would name other rows than the ones sampled and accounted."""
