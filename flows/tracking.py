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


def log_text_artifacts(files: Dict[str, str]) -> None:
    """Write each ``name -> text`` into the active run's artifact root."""
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in files.items():
            path = Path(tmp, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            mlflow.log_artifact(str(path), artifact_path=str(Path(name).parent) if Path(name).parent != Path(".") else None)


def journal_json(entries: Iterable) -> str:
    return json.dumps([{"step": e.step, "seed": e.seed, "coefficient": e.coefficient} for e in entries])
