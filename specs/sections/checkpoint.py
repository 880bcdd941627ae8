"""The ``checkpoint`` section: the chunks a run is trained in, and how a crashed one resumes."""
from __future__ import annotations

from typing import Optional

from pydantic import Field, PositiveInt

from specs.base import Strict


class CheckpointSpec(Strict):
    """Training runs in checkpointed chunks; a crashed run resumes from its last checkpoint."""

    dir: str = Field(".privzo/checkpoints", min_length=1,
                     description="Where chunk checkpoints live (one folder per spec name and run key).")
    every: Optional[PositiveInt] = Field(None, description="Steps between checkpoints; default tracking.log_every.")
    retries: int = Field(2, ge=0, le=10, description="Prefect retries of a failed chunk, each from the last checkpoint.")
    keep: bool = Field(False, description="Keep the last checkpoint after the run succeeds.")
