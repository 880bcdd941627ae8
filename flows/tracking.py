"""MLflow conventions (DESIGN §7): params = flattened resolved spec, dp.* tags, per-step metrics."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Dict, Iterable

import mlflow

from flows.reporting import PrivacySummary


def dp_tags(summary: PrivacySummary, data_fingerprint: str) -> Dict[str, str]:
    return {
        "dp.epsilon": f"{summary.epsilon:.6g}",
        "dp.delta": f"{summary.delta:.6g}",
        "dp.accountant": summary.accountant,
        "dp.neighboring": summary.neighboring,
        "dp.guarantee": summary.guarantee(),
        "dp.noise_multiplier": f"{summary.noise_multiplier:.6g}",
        "dp.steps": str(summary.steps),
        "dp.private": "true" if summary.private else "false",
        "data.fingerprint": data_fingerprint,
    }


def log_text_artifacts(client: mlflow.MlflowClient, run_id: str, files: Dict[str, str]) -> None:
    """Write each ``relative/name -> text`` into the run's artifact root (no active run needed)."""
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in files.items():
            path = Path(tmp, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            parent = str(Path(name).parent)
            client.log_artifact(run_id, str(path), artifact_path=None if parent == "." else parent)


def journal_json(entries: Iterable) -> str:
    return json.dumps([{"step": e.step, "seed": e.seed, "coefficient": e.coefficient} for e in entries])
