"""The ``tracking`` section: the MLflow store a run is recorded in."""
from __future__ import annotations

import os
from typing import Literal, Optional

from pydantic import Field, PositiveInt, field_validator

from specs.base import Strict


# MLflow's own tracking and registry stores; anything else fails only after a ledger reservation
_TRACKING_SCHEMES = ("file", "sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks")

# Where a spec names no tracking store, the environment does, as MLflow's own clients read
# MLFLOW_TRACKING_URI: a team's workers point every run at the shared server (infra/compose) without each
# spec naming it. The resolved spec, which is what gets logged, holds the value used.
TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"


def tracking_uri_from_env() -> str:
    return os.environ.get(TRACKING_URI_ENV, "").strip() or "sqlite:///mlflow.db"


class TrackingSpec(Strict):
    uri: str = Field(default_factory=tracking_uri_from_env, min_length=1,
                     description="MLflow tracking URI: sqlite:///PATH, a folder, postgresql://, mysql://, "
                     f"http(s)://. Default: ${TRACKING_URI_ENV}, else sqlite:///mlflow.db.")
    experiment: Optional[str] = Field(None, description="MLflow experiment; default: the spec name.")
    log_every: PositiveInt = Field(50, description="Steps between metric points (epsilon, eval).")
    register_as: Literal["weights", "transcript"] = Field(
        "weights", description="What the registered model version holds. weights: the trained PyTorch model. "
        "transcript: the resolved spec, the run's journal of (seed, coefficient) steps and a reference to its "
        "public initial weights (kilobytes, no weights), an MLflow pyfunc whose loading rebuilds the weights by "
        "replay (flows/record/transcript.py); only where the journal is the whole trajectory (two_point with sgd).")

    @field_validator("uri")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        scheme = value.split("://", 1)[0].split("+", 1)[0].lower() if "://" in value else "file"
        if scheme not in _TRACKING_SCHEMES:
            raise ValueError(f"unsupported scheme {scheme!r} (from the spec, or ${TRACKING_URI_ENV} where the "
                             f"spec names none); allowed: sqlite:///PATH, a folder path, "
                             f"{', '.join(s + '://' for s in _TRACKING_SCHEMES if s not in ('file', 'sqlite'))}")
        return value
