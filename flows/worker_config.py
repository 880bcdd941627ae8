"""A team worker's own configuration: the ledger its deployment runs are charged to.

The local team stack (infra/local-stack.sh) writes it to ``.privzo-stack/worker.json`` beside the code the
worker runs (mode 600), infra/compose mounts it at ``/etc/privzo/worker.json``, and a deployment's flow run
reads it from there: never from the environment, which a Prefect user sets for any run through the pool's
job variables (``-jv env=...``). A run whose job variables replace its command runs other code and is not
held by this file; docs/design.md says what such a user can do.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from specs.sections import sqlite_ledger_problem

# named by no variable: beside the code, where the local stack that started this worker keeps its state;
# else the system's, where a container's is mounted
WORKER_CONFIG = Path(__file__).resolve().parents[1] / ".privzo-stack" / "worker.json"
SYSTEM_WORKER_CONFIG = Path("/etc/privzo/worker.json")


def worker_ledger(path: Optional[Path] = None) -> Optional[str]:
    """The ledger URL the worker's configuration names, or None where this checkout runs no team worker."""
    if path is None:
        path = next((p for p in (WORKER_CONFIG, SYSTEM_WORKER_CONFIG) if p.exists()), None)
        if path is None:
            return None
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as err:  # a worker that cannot read its own configuration charges nowhere
        raise ValueError(f"budget.ledger: this worker's configuration {path} cannot be read ({err.strerror}); "
                         "nothing was read or charged") from None
    try:
        ledger = json.loads(text)["ledger"]
    except (ValueError, KeyError, TypeError):
        ledger = None
    if not isinstance(ledger, str) or not ledger.strip() or sqlite_ledger_problem(ledger):
        raise ValueError(f"budget.ledger: this worker's configuration {path} names no usable ledger (a JSON object "
                         "whose \"ledger\" is a SQLAlchemy URL); the stack writes it at `up`; nothing was read or "
                         "charged")
    return ledger.strip()


def deployment_run() -> bool:
    """Whether this flow run was started from a deployment (by a team's worker), not in-process."""
    try:
        from prefect.runtime import deployment

        return deployment.id is not None
    except Exception:  # noqa: BLE001 - outside a flow run there is no deployment
        return False
