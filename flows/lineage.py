"""A model's lineage: the registered version a run starts from (``optimizer.init: latest_registered``), and
what the model has spent over every run that trained it, as a DpEvent in all and per block. The training
flow writes it with each run; ``privzo verify`` recomputes it from the ledger's charges and checks it."""
from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Dict, Optional, Tuple

import dp_accounting
import mlflow
from mlflow.exceptions import MlflowException
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

import specs
from components import builders
from components.accountants import Accountant, event_from_json
from flows.refusals import checks_input, not_refused

@task(name="registered-source", cache_policy=NO_CACHE, retries=2, retry_condition_fn=not_refused)
@checks_input
def registered_source(spec: specs.RunSpec) -> Optional[Dict[str, str]]:
    """``optimizer.init: latest_registered``: the latest registered version of this spec's model, checked
    before anything is reserved or written. A private run never starts from a version that is not DP."""
    if spec.optimizer.init != "latest_registered":
        return None

    client = mlflow.MlflowClient(spec.tracking.uri)
    try:
        versions = client.search_model_versions(f"name = '{spec.name}'")
    except MlflowException:
        versions = []
    if not versions:
        get_run_logger().info("no registered version of %s yet: starting from the seed initialisation", spec.name)
        return None
    latest = max(versions, key=lambda v: int(v.version))
    tags = latest.tags or {}
    if spec.private and tags.get("dp.private") != "true":
        raise ValueError(f"optimizer.init: registered model {spec.name} version {latest.version} is not "
                         f"differentially private (dp.private={tags.get('dp.private')!r}); a private run "
                         f"cannot start from it; use init: seed")
    if spec.budget is not None:
        from flows.ledger import PrivacyLedger

        # the ledger's total is exact only if the model this run continues was charged to it too
        if not PrivacyLedger.open(spec.budget.ledger).charged_run(spec.budget.dataset, latest.run_id):
            raise ValueError(f"optimizer.init: registered model {spec.name} version {latest.version} was trained "
                             f"by a run not charged to dataset {spec.budget.dataset!r}, so its epsilon is not in "
                             f"the ledger; use init: seed, or register the model under another name")
    return {"privzo.init": f"models:/{spec.name}/{latest.version}", "privzo.init_run_id": latest.run_id,
            "privzo.init_epsilon": tags.get("dp.model_epsilon", tags.get("dp.epsilon", "unknown")),
            "privzo.init_data_fingerprint": tags.get("data.fingerprint", "unknown")}


MODEL_EVENT = "model_dp_event.json"
MODEL_BLOCK_EVENTS = "model_dp_events_by_block.json"


def model_block_events(client: mlflow.MlflowClient, run_id: str, window: Tuple[str, ...],
                       event: dp_accounting.DpEvent, composed: Optional[dp_accounting.DpEvent]
                       ) -> Optional[Dict[str, dp_accounting.DpEvent]]:
    """A model trained on blocks: for each block any run of its lineage read, the composition of those runs'
    events on it (``event``, this run's, on each block of ``window``). A start trained before blocks counts
    with its whole composition (``composed``, as ``model_event`` gives it) on every block of this window:
    it read all of them. None where a start's events are unknown."""
    source = client.get_run(run_id).data.tags.get("privzo.init_run_id")
    if source is None:
        return {block: event for block in window}
    with tempfile.TemporaryDirectory() as folder:
        try:
            saved = json.loads(Path(client.download_artifacts(source, MODEL_BLOCK_EVENTS, folder)).read_text())
        except (MlflowException, OSError):
            return None if composed is None else {block: composed for block in window}
    before = {block: event_from_json(text) for block, text in saved.items()}
    return {**before, **{block: dp_accounting.ComposedDpEvent([before[block], event]) if block in before else event
                         for block in window}}


def model_event(client: mlflow.MlflowClient, run_id: str, spec: specs.RunSpec,
                event: dp_accounting.DpEvent) -> Optional[dp_accounting.DpEvent]:
    """Everything the model of ``run_id`` was trained with: ``event`` (this run's), composed with the model
    it started from (``privzo.init_run_id``), whose own ``model_dp_event.json`` holds the same for its start,
    and so on back to a seed initialisation. Composition is what the model's guarantee is when the runs
    trained on the same people, and an upper bound otherwise. None when a start's events are unknown (a
    run logged before privzo kept them) or were accounted under another neighbouring relation."""
    source = client.get_run(run_id).data.tags.get("privzo.init_run_id")
    if source is None:
        return event
    try:
        started = client.get_run(source).data.tags
    except MlflowException:  # the run it started from was deleted: its events are unknown
        return None
    if spec.privacy is not None and started.get("dp.neighboring") != spec.privacy.neighboring:
        return None
    names = [MODEL_EVENT] + ([] if "privzo.init_run_id" in started or started.get("privzo.init", "seed").startswith(
        "models:/") else ["dp_event.json"])  # a run that started from the seed: its own event is its model's
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            try:
                before = event_from_json(Path(client.download_artifacts(source, name, folder)).read_text())
            except (MlflowException, OSError):
                continue
            return dp_accounting.ComposedDpEvent([before, event])
    return None


def model_epsilon(spec: specs.RunSpec, event: Optional[dp_accounting.DpEvent]) -> float:
    """epsilon of a model's composed event at this run's delta (inf where unknown or not private)."""
    if event is None or spec.privacy is None:
        return math.inf
    for acc in (builders.accountant(spec), Accountant("rdp", spec.privacy.neighboring)):
        try:
            return acc.epsilon(event, float(spec.privacy.delta))
        except ValueError:  # e.g. a zcdp run continuing a Poisson-sampled one: rdp accounts for both
            continue
    return math.inf


def model_runs(client: mlflow.MlflowClient, run_id: str) -> int:
    """How many runs trained the model of ``run_id``: it and those of the version it started from."""
    source = client.get_run(run_id).data.tags.get("privzo.init_run_id")
    if source is None:
        return 1
    try:
        return 1 + int(client.get_run(source).data.tags.get("dp.model_runs", "1"))
    except MlflowException:
        return 2
