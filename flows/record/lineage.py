"""A model's lineage: the registered version a run starts from (``optimizer.init: latest_registered``), and
what the model has spent over every run that trained it, as a DpEvent in all and per block. The training
flow writes it with each run; ``privzo verify`` recomputes it from the ledger's charges and checks it."""
from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Optional, Tuple

import dp_accounting
import mlflow
from mlflow.exceptions import MlflowException
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

import specs
from components import builders
from components.accountants import Accountant, event_from_json
from specs.refusal import checks_input, not_refused
from flows.record.tracking_names import (
    DATA_FINGERPRINT, DP_EPSILON, DP_EVENT_ARTIFACT, DP_MODEL_EPSILON, DP_MODEL_RUNS, DP_NEIGHBORING, DP_PRIVATE,
    MODEL_BLOCK_EVENTS_ARTIFACT, MODEL_EVENT_ARTIFACT, PRIVZO_INIT, PRIVZO_INIT_DATA_FINGERPRINT,
    PRIVZO_INIT_EPSILON, PRIVZO_INIT_RUN_ID)

@task(name="registered-source", cache_policy=NO_CACHE, retries=2, retry_condition_fn=not_refused)
@checks_input
def registered_source(spec: specs.RunSpec, budget: Optional["Budget"]) -> Optional[Dict[str, str]]:
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
    if spec.private and tags.get(DP_PRIVATE) != "true":
        raise ValueError(f"optimizer.init: registered model {spec.name} version {latest.version} is not "
                         f"differentially private (dp.private={tags.get(DP_PRIVATE)!r}); a private run "
                         f"cannot start from it; use init: seed")
    if budget is not None:
        # the ledger's total is exact only if the model this run continues was charged to it too
        if not budget.ledger.charged_run(budget.dataset, latest.run_id):
            raise ValueError(f"optimizer.init: registered model {spec.name} version {latest.version} was trained "
                             f"by a run not charged to dataset {spec.budget.dataset!r}, so its epsilon is not in "
                             f"the ledger; use init: seed, or register the model under another name")
    return {PRIVZO_INIT: f"models:/{spec.name}/{latest.version}", PRIVZO_INIT_RUN_ID: latest.run_id,
            PRIVZO_INIT_EPSILON: tags.get(DP_MODEL_EPSILON, tags.get(DP_EPSILON, "unknown")),
            PRIVZO_INIT_DATA_FINGERPRINT: tags.get(DATA_FINGERPRINT, "unknown")}

if TYPE_CHECKING:
    from flows.ledger import Budget




def model_block_events(client: mlflow.MlflowClient, run_id: str, window: Tuple[str, ...],
                       event: dp_accounting.DpEvent, composed: Optional[dp_accounting.DpEvent]
                       ) -> Optional[Dict[str, dp_accounting.DpEvent]]:
    """A model trained on blocks: for each block any run of its lineage read, the composition of those runs'
    events on it (``event``, this run's, on each block of ``window``). A start trained before blocks counts
    with its whole composition (``composed``, as ``model_event`` gives it) on every block of this window:
    it read all of them. None where a start's events are unknown."""
    source = client.get_run(run_id).data.tags.get(PRIVZO_INIT_RUN_ID)
    if source is None:
        return {block: event for block in window}
    with tempfile.TemporaryDirectory() as folder:
        try:
            saved = json.loads(Path(client.download_artifacts(source, MODEL_BLOCK_EVENTS_ARTIFACT, folder)).read_text())
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
    source = client.get_run(run_id).data.tags.get(PRIVZO_INIT_RUN_ID)
    if source is None:
        return event
    try:
        started = client.get_run(source).data.tags
    except MlflowException:  # the run it started from was deleted: its events are unknown
        return None
    if spec.privacy is not None and started.get(DP_NEIGHBORING) != spec.privacy.neighboring:
        return None
    names = [MODEL_EVENT_ARTIFACT] + ([] if PRIVZO_INIT_RUN_ID in started or started.get(PRIVZO_INIT, "seed").startswith(
        "models:/") else [DP_EVENT_ARTIFACT])  # a run that started from the seed: its own event is its model's
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
    source = client.get_run(run_id).data.tags.get(PRIVZO_INIT_RUN_ID)
    if source is None:
        return 1
    try:
        return 1 + int(client.get_run(source).data.tags.get(DP_MODEL_RUNS, "1"))
    except MlflowException:
        return 2
