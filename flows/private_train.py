"""``private_train``: resolve -> load and split -> calibrate sigma -> train in chunks -> evaluate -> log.

Reads like the algorithm: every side effect (MLflow, Prefect artifacts, files) is here, every
computation is a component. A chunk of training draws DP noise, so its task is never cached and never
retried (a retry would release fresh noise on the same data without accounting for it).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import mlflow
import numpy as np
import torch
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from mlflow.entities import Metric, Param, RunTag

import specs
from components import builders, models
from components.accountants import event_to_json
from components.data import SplitData
from flows.reporting import PrivacySummary, privacy_report, summarize
from flows.tracking import dp_tags, journal_json, log_text_artifacts


@dataclass(frozen=True)
class Plan:
    spec: specs.RunSpec  # resolved
    n_private: int
    sampling_rate: float
    planned_epsilon: float


@task(name="load-and-split", cache_policy=NO_CACHE, retries=2)
def load_and_split(spec: specs.RunSpec) -> SplitData:
    data = builders.load_data(spec)
    get_run_logger().info(
        "split %s: %d public, %d private, %d test rows", spec.data.source.name, len(data.public),
        len(data.private), len(data.test))
    return data


@task(name="calibrate", cache_policy=NO_CACHE)
def calibrate(spec: specs.RunSpec, n_private: int) -> Plan:
    resolved, rate, eps = builders.resolve_privacy(spec, n_private)
    return Plan(resolved, n_private, rate, eps)


@task(name="reserve-budget", cache_policy=NO_CACHE, retries=0)
def reserve_budget(plan: Plan, fingerprint: str) -> Optional[str]:
    """Reserve the planned DpEvent on the dataset's lifetime budget, in one transaction, before any
    private row is queried; refuses (writing nothing) if the composed total would exceed it."""
    spec = plan.spec
    if spec.budget is None:
        return None
    from flows.ledger import PrivacyLedger

    ledger = PrivacyLedger(spec.budget.ledger)
    return ledger.reserve(
        dataset=spec.budget.dataset, fingerprint=fingerprint, run_name=spec.name,
        planned=builders.planned_event(spec, plan.n_private, float(spec.mechanism.noise_multiplier)),
        steps=spec.optimizer.steps, lifetime_epsilon=spec.budget.lifetime_epsilon, delta=float(spec.privacy.delta),
        accountant=spec.privacy.accountant, neighboring=spec.privacy.neighboring)


@task(name="commit-budget", cache_policy=NO_CACHE, retries=3)
def commit_budget(spec: specs.RunSpec, charge_id: str, event_json: str, steps: int, run_id: Optional[str]) -> float:
    """Charge what was executed (all steps, or those before a crash); returns the dataset's budget left."""
    from components.accountants import event_from_json
    from flows.ledger import PrivacyLedger

    ledger = PrivacyLedger(spec.budget.ledger)
    ledger.commit(charge_id, event_from_json(event_json), steps, run_id)
    return spec.budget.lifetime_epsilon - ledger.spent(spec.budget.dataset)


@task(name="public-warm-start", cache_policy=NO_CACHE, retries=0)
def public_warm_start(spec: specs.RunSpec, built: builders.Built) -> int:
    """Plain training on public rows before the private phase (no privacy cost)."""
    return builders.public_warm_start(spec, built)


@task(name="train-chunk", cache_policy=NO_CACHE, retries=0)
def train_chunk(built: builders.Built, until: int, progress=None) -> int:
    start = built.loop.step
    built.loop.run(until, on_step=(lambda _s: progress.update(1)) if progress is not None else None)
    return built.loop.step - start


@task(name="evaluate", cache_policy=NO_CACHE)
def evaluate(built: builders.Built, data: SplitData) -> Dict[str, float]:
    """Metrics on the declared evaluation split and on public data only (never private training rows)."""
    dev = built.device
    out = {f"eval/{k}": v for k, v in models.evaluate(
        built.model, torch.as_tensor(data.test.features, device=dev), torch.as_tensor(data.test.labels, device=dev)
    ).items()}
    if len(data.public):
        out["public/loss"] = models.evaluate(
            built.model, torch.as_tensor(data.public.features, device=dev),
            torch.as_tensor(data.public.labels, device=dev))["loss"]
    return out


def _summary(plan: Plan, built: builders.Built) -> PrivacySummary:
    loop = built.loop
    return summarize(plan.spec, loop.tracker.epsilon(), loop.tracker.steps, plan.sampling_rate,
                     loop.estimator.queries_per_step)


def _load(spec_path: Optional[str], spec: Optional[Dict[str, Any]]) -> specs.RunSpec:
    if (spec_path is None) == (spec is None):
        raise ValueError("private_train: give exactly one of spec_path or spec")
    return specs.load_spec(spec_path) if spec_path is not None else specs.spec_from_dict(spec)


@task(name="open-run", cache_policy=NO_CACHE, retries=2)
def open_run(plan: Plan, data: SplitData, dimension: int, device: str) -> str:
    """Create the MLflow run with the resolved spec as params; nothing private is read here."""
    spec = plan.spec
    mlflow.set_tracking_uri(spec.tracking.uri)
    experiment = mlflow.set_experiment(spec.tracking.experiment or spec.name)
    client = mlflow.MlflowClient(spec.tracking.uri)
    run = client.create_run(experiment.experiment_id, run_name=spec.name, tags={
        "privzo.spec": spec.name, "privzo.estimator": spec.estimator.kind,
        "dp.target_epsilon": str(spec.privacy.epsilon if spec.privacy else math.inf),
        "dp.private": str(spec.private).lower()})
    params = dict(specs.flatten(spec))
    params.update({
        "derived.n_private": str(len(data.private)), "derived.n_public": str(len(data.public)),
        "derived.n_test": str(len(data.test)), "derived.sampling_rate": repr(plan.sampling_rate),
        "derived.dimension": str(dimension), "derived.device": device})
    client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in params.items()])
    log_text_artifacts(client, run.info.run_id, {"spec.yaml": specs.dump_yaml(spec)})
    return run.info.run_id


@task(name="log-metrics", cache_policy=NO_CACHE, retries=2)
def log_metrics(tracking_uri: str, run_id: str, metrics: Dict[str, float], step: int) -> None:
    now = int(time.time() * 1000)
    mlflow.MlflowClient(tracking_uri).log_batch(
        run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])


@task(name="log-privacy", cache_policy=NO_CACHE, retries=2)
def log_privacy(tracking_uri: str, run_id: str, tags: Dict[str, str], report: str, event_json: str,
                journal: str) -> None:
    """What was spent, whatever happened: DP tags, the composed DpEvent, the report and the journal."""
    client = mlflow.MlflowClient(tracking_uri)
    client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
    log_text_artifacts(client, run_id, {
        "dp_event.json": event_json, "privacy_report.md": report, "journal/journal.json": journal})


@task(name="register-model", cache_policy=NO_CACHE)
def register_model(tracking_uri: str, run_id: str, model: torch.nn.Module, row_shape: Tuple[int, ...], row_dtype: str,
                   name: str, tags: Dict[str, str]) -> str:
    """``row_shape``/``row_dtype``: of one input row (float features, or token ids and mask for text)."""
    mlflow.set_tracking_uri(tracking_uri)
    with mlflow.start_run(run_id=run_id):
        info = mlflow.pytorch.log_model(
            model.cpu(), name="model", pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],
            # all-zero rows: the exported graph needs an example input, and no real row may be logged
            input_example=np.zeros((2, *row_shape), dtype=row_dtype),  # 2 rows: batch size stays dynamic
            registered_model_name=name)
    client = mlflow.MlflowClient(tracking_uri)
    version = str(info.registered_model_version)
    for key, value in tags.items():  # registered models carry the DP tags
        client.set_model_version_tag(name, version, key, value)
    return version


@flow(name="private-train", log_prints=True, validate_parameters=True)
def private_train(spec_path: Optional[str] = None, spec: Optional[Dict[str, Any]] = None,
                  progress: bool = False) -> Dict[str, Any]:
    """Train a model under differential privacy as declared by one run spec (a YAML path or a mapping)."""
    run_spec = _load(spec_path, spec)
    if run_spec.execution.threads:
        torch.set_num_threads(run_spec.execution.threads)
    data = load_and_split(run_spec)
    plan = calibrate(run_spec, len(data.private))
    resolved = plan.spec
    uri = resolved.tracking.uri
    charge_id = reserve_budget(plan, data.private.fingerprint)
    try:
        built = builders.build_loop(resolved, data)
    except BaseException:
        if charge_id is not None:  # nothing was queried: release the reservation
            from flows.ledger import PrivacyLedger

            PrivacyLedger(resolved.budget.ledger).abort(charge_id)
        raise
    run_id = None
    try:
        run_id = open_run(plan, data, built.loop.backend.directions.dim, str(built.device))
        result, report = _train_and_log(plan, data, built, run_id, progress)
    finally:
        if charge_id is not None:  # the ledger is charged with the steps actually executed, whatever happened
            left = commit_budget(resolved, charge_id, event_to_json(built.loop.tracker.event()),
                                 built.loop.tracker.steps, run_id)
            get_run_logger().info("dataset %s: %.4g epsilon left", resolved.budget.dataset, left)
    if charge_id is not None:
        result["budget_left"] = left
        mlflow.MlflowClient(uri).set_tag(run_id, "dp.budget_left", f"{left:.6g}")
        report += (f"\n**Dataset budget.** {resolved.budget.dataset}: {left:.4g} of "
                   f"{resolved.budget.lifetime_epsilon:g} epsilon left (ledger: exact composition of every run).\n")
    create_markdown_artifact(report, key=_artifact_key(resolved.name), description="privzo privacy report")
    return result


def _train_and_log(plan: Plan, data: SplitData, built: builders.Built, run_id: str, progress: bool):
    """Train in chunks, log as we go; returns (result, privacy report markdown)."""
    resolved = plan.spec
    uri = resolved.tracking.uri
    total = resolved.optimizer.steps
    warm_steps = public_warm_start(resolved, built)
    if warm_steps:
        log_metrics(uri, run_id, {"public/warm_start_steps": warm_steps, **evaluate(built, data)}, 0)

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, desc=f"{resolved.name} private steps", unit="step", leave=False)
    metrics: Dict[str, float] = {}
    status = "FAILED"
    try:
        while built.loop.step < total:
            until = min(total, built.loop.step + resolved.tracking.log_every)
            train_chunk(built, until, bar)
            metrics = evaluate(built, data)
            if resolved.privacy is not None:
                metrics["privacy/epsilon"] = built.loop.tracker.epsilon()
            log_metrics(uri, run_id, metrics, built.loop.step)
        status = "FINISHED"
    finally:
        # whatever happened, record what was spent: the steps executed are the privacy cost
        if bar is not None:
            bar.close()
        close = getattr(built.loop.backend, "close", None)
        if close is not None:
            close()  # Ray workers hold private rows: stop them with the run
        summary = _summary(plan, built)
        tags = dp_tags(summary, data.private.fingerprint)
        report = privacy_report(summary, {k: v for k, v in metrics.items() if not math.isnan(v)})
        log_privacy(uri, run_id, tags, report, event_to_json(built.loop.tracker.event()),
                    journal_json(built.loop.journal))
        if status != "FINISHED":
            mlflow.MlflowClient(uri).set_terminated(run_id, "FAILED")
    version = register_model(uri, run_id, built.model, data.test.features.shape[1:], str(data.test.features.dtype),
                             resolved.name, tags)
    mlflow.MlflowClient(uri).set_terminated(run_id, "FINISHED")
    run = mlflow.MlflowClient(uri).get_run(run_id)
    return {
        "run_id": run_id, "experiment_id": run.info.experiment_id, "tracking_uri": uri,
        "epsilon": summary.epsilon, "delta": summary.delta, "target_epsilon": summary.target_epsilon,
        "noise_multiplier": summary.noise_multiplier, "steps": summary.steps, "guarantee": summary.guarantee(),
        "model_version": version, **metrics,
    }, report


def _artifact_key(name: str) -> str:
    # Prefect artifact keys allow lowercase letters, digits and dashes only
    return "privacy-report-" + "".join(c if c.isalnum() else "-" for c in name.lower())


