"""A worker's own configuration: the ledger its deployment runs are charged to.

A deployment's flow run reads it from the system's path ``/etc/privzo/worker.json`` (the team stack writes it
there, readable by its training user, writable by root only; infra/compose mounts it there), else from
``.privzo-stack/worker.json`` beside the code (a personal stack's): never from the environment, which a
Prefect user sets for any run through the pool's job variables (``-jv env=...``). The system's comes first,
so a deployment of the same code from another checkout (which may hold a file of its own beside it) on the
team's worker is pinned by the team's. ``{"ledger": null}`` is a personal worker, whose runs are charged where
their specs say. A deployment's run on a worker without either file is refused. ``"ray"``, where the stack has
a Ray head (PRIVZO_STACK_RAY=1), is its address: every deployment run on that worker runs its steps there, and
on no other cluster (a spec naming another ships the rows elsewhere). A run whose job variables
replace its command runs other code and is not held by this file; docs/design.md says what such a user can do.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from specs.sections import sqlite_ledger_problem

# named by no variable: the system's, where the team stack and a container keep it; else beside the code,
# where a personal local stack keeps its state
SYSTEM_WORKER_CONFIG = Path("/etc/privzo/worker.json")
WORKER_CONFIG = Path(__file__).resolve().parents[1] / ".privzo-stack" / "worker.json"


class NoWorkerConfig(ValueError):
    """A deployment's run on a worker that no stack configured."""


def worker_config() -> Optional[Path]:
    """The configuration this worker's runs read: the system's first, then the one beside the code."""
    return next((p for p in (SYSTEM_WORKER_CONFIG, WORKER_CONFIG) if p.exists()), None)


def worker_ledger(path: Optional[Path] = None) -> Optional[str]:
    """The ledger URL the worker's configuration names; None for a personal worker's (``"ledger": null``);
    ``NoWorkerConfig`` where there is none."""
    if path is None:
        path = worker_config()
        if path is None:
            raise NoWorkerConfig(
                f"budget.ledger: this deployment's run found no worker configuration ({SYSTEM_WORKER_CONFIG} or "
                f"{WORKER_CONFIG}); a worker's ledger is named by that file, never by the environment a job "
                "variable sets: start the worker with the stack (make up), which writes it; nothing was read or "
                "charged")
    try:
        ledger = _read(path, "budget.ledger").get("ledger", "")
    except FileNotFoundError:
        return None
    if ledger is None:  # a personal worker's
        return None
    if not isinstance(ledger, str) or not ledger.strip() or sqlite_ledger_problem(ledger):
        raise ValueError(f"budget.ledger: this worker's configuration {path} names no usable ledger (a JSON object "
                         "whose \"ledger\" is a SQLAlchemy URL, or null for a personal worker); the stack writes it "
                         "at `up`; nothing was read or charged")
    return ledger.strip()


def worker_ray(path: Optional[Path] = None) -> Optional[str]:
    """The address of the Ray cluster the worker's configuration names for its runs' steps (its stack's head);
    None where it names none, or there is no configuration."""
    path = path or worker_config()
    if path is None:
        return None
    try:
        address = _read(path, "execution.address").get("ray")
    except FileNotFoundError:
        return None
    if address is None:
        return None
    if not isinstance(address, str) or not address.strip():
        raise ValueError(f"execution.address: this worker's configuration {path} names no usable Ray cluster (its "
                         "\"ray\" is a head's address host:port, or null); the stack writes it at `up`; nothing was "
                         "read or charged")
    return address.strip()


def _read(path: Path, field: str) -> dict:
    """The configuration's JSON object ({} where it holds none: each entry's reader says what is wrong);
    FileNotFoundError where it went."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise
    except OSError as err:  # a worker that cannot read its own configuration runs nothing
        raise ValueError(f"{field}: this worker's configuration {path} cannot be read ({err.strerror}); "
                         "nothing was read or charged") from None
    try:
        config = json.loads(text)
    except ValueError:
        return {}
    return config if isinstance(config, dict) else {}


def deployment_run() -> bool:
    """Whether this flow run was started from a deployment (by a team's worker), not in-process."""
    try:
        from prefect.runtime import deployment

        return deployment.id is not None
    except Exception:  # noqa: BLE001 - outside a flow run there is no deployment
        return False
