"""What a training run writes to MLflow: the run and its params, metrics as it goes, what it spent (DP tags,
DpEvents, the privacy report and journal, whatever happened), the registered version headed by the model's
guarantee, and the run's summary and budget table. Names from flows/record/tracking_names.py; sentences from
flows/record/reporting.py. The flow (flows/private_train.py) calls these in order."""
from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import mlflow
import numpy as np
import torch
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, RunTag
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

import specs
from components import builders
from components.accountants import event_to_json
from components.data import SplitData
from components.data.split import Preprocessing
from components.directions import GENERATOR_VERSION
from flows.record import reporting
from flows.ledger import Budget
from flows.record.lineage import model_block_events, model_epsilon, model_event, model_runs
from flows.record.reporting import PrivacySummary, privacy_report, shown, summarize
from flows.record.tracking import (DESCRIPTION, code_version, dataset_input, dp_tags, experiment_url, journal_json,
                                   log_text_artifacts, released_fingerprint, run_name, run_url, training_experiment,
                                   ui_command, version_url)
from flows.record.tracking_names import (
    DERIVED_DEVICE, DERIVED_DIMENSION, DERIVED_N_PRIVATE, DERIVED_N_PUBLIC, DERIVED_N_TEST, DERIVED_SAMPLING_RATE,
    DP_EPSILON, DP_EVENT_ARTIFACT, DP_GUARANTEE, DP_MODEL_EPSILON, DP_MODEL_RUNS, DP_PRIVATE, DP_RUN_EPSILON,
    DP_RUN_GUARANTEE, DP_TARGET_EPSILON, JOURNAL_ARTIFACT, MLFLOW_DATASET_CONTEXT, MODEL_ARTIFACT, MODEL_BLOCK_EVENTS_ARTIFACT,
    MODEL_EVENT_ARTIFACT, PRIVACY_REPORT_ARTIFACT, PRIVZO_BLOCKS, PRIVZO_DIRECTIONS_STREAM,
    PRIVZO_DIRECTIONS_VERSION, PRIVZO_ESTIMATOR, PRIVZO_INIT, PRIVZO_REGISTER, PRIVZO_RESUMED_FROM_STEP,
    PRIVZO_SPEC, PRIVZO_TRANSCRIPT_BYTES, PRIVZO_WEIGHTS_BYTES, SPEC_ARTIFACT)
from flows.record.served import log_served_model
from flows.record.transcript import Transcript, log_transcript_model, replays_to, transcript_of, weights_bytes


def privacy_summary(spec: specs.RunSpec, built: builders.Built, selection: Optional[str] = None) -> PrivacySummary:
    """What the steps the loop executed spent, as the report and the tags state it; ``selection``: a tune's
    search, which the winner's guarantee includes (its loop's tracker then composes it)."""
    loop = built.loop
    summary = summarize(spec, loop.tracker.epsilon(), loop.tracker.steps, loop.sampler,
                        loop.estimator.queries_per_step, rho=loop.tracker.rho(),
                        noise_source=loop.mechanism.noise_source)
    return summary if selection is None else dataclasses.replace(summary, selection=selection)


@task(name="open-run", cache_policy=NO_CACHE, retries=2)
def open_run(spec: specs.RunSpec, sampling_rate: float, data: SplitData, dimension: int, device: str) -> str:
    """Create the MLflow run with the resolved spec as params; nothing private is read here."""
    client = mlflow.MlflowClient(spec.tracking.uri)
    experiment_id = training_experiment(client, spec.tracking.experiment or spec.name)
    run = client.create_run(experiment_id, run_name=run_name(spec.name), tags={
        PRIVZO_SPEC: spec.name, PRIVZO_ESTIMATOR: spec.estimator.kind,
        DP_TARGET_EPSILON: str(spec.privacy.epsilon if spec.privacy else math.inf),
        DP_PRIVATE: str(spec.private).lower(), **code_version()})
    params = dict(specs.flatten(spec))
    params.update({
        DERIVED_N_PUBLIC: str(len(data.public)), DERIVED_N_TEST: str(len(data.test)),
        DERIVED_SAMPLING_RATE: repr(sampling_rate), DERIVED_DIMENSION: str(dimension),
        DERIVED_DEVICE: device})
    if spec.private_count_is_public:  # under add/remove the count is private and never released
        params[DERIVED_N_PRIVATE] = str(len(data.private))
    client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in params.items()])
    log_text_artifacts(client, run.info.run_id, {SPEC_ARTIFACT: specs.dump_yaml(spec)})
    dataset = dataset_input(spec, released_fingerprint(data.private.fingerprint))
    client.log_inputs(run.info.run_id, datasets=[DatasetInput(Dataset(**dataset.to_dict()), tags=[
        InputTag(MLFLOW_DATASET_CONTEXT, "training")])])
    return run.info.run_id


@task(name="log-metrics", cache_policy=NO_CACHE, retries=2)
def log_metrics(tracking_uri: str, run_id: str, metrics: Dict[str, float], step: int) -> None:
    now = int(time.time() * 1000)
    mlflow.MlflowClient(tracking_uri).log_batch(
        run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])


@task(name="log-privacy", cache_policy=NO_CACHE, retries=2)
def log_privacy(tracking_uri: str, run_id: str, tags: Dict[str, str], report: str, event_json: str,
                journal: str, extra: Optional[Dict[str, str]] = None) -> None:
    """What was spent, whatever happened: DP tags, the composed DpEvent, the report and the journal."""
    client = mlflow.MlflowClient(tracking_uri)
    client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
    log_text_artifacts(client, run_id, {
        DP_EVENT_ARTIFACT: event_json, PRIVACY_REPORT_ARTIFACT: report, JOURNAL_ARTIFACT: journal, **(extra or {})})


@task(name="register-model", cache_policy=NO_CACHE)
def register_model(tracking_uri: str, run_id: str, model: torch.nn.Module, row_shape: Tuple[int, ...], row_dtype: str,
                   name: str, tags: Dict[str, str], description: str = "",
                   transcript: Optional[Transcript] = None, charged: bool = True,
                   preprocessing: Optional[Preprocessing] = None) -> str:
    """``row_shape``/``row_dtype``: of one input row (float features, or token ids and mask for text).
    ``tags`` lead with the model's guarantee (dp.epsilon, dp.guarantee: every run that trained it), the
    run's own spend beside it (dp.run_*); ``description`` is the version's, headed by the same.
    ``transcript``: register it (an MLflow pyfunc that rebuilds the weights by replay) in place of the weights.
    ``charged``: its run was charged to a ledger (the description's verify line says what verify can check).
    ``preprocessing``: how a stored row becomes the model's input (rows of named numbers): the version is then
    the served model of flows/record/served.py, which takes those rows and answers in class names."""
    mlflow.set_tracking_uri(tracking_uri)
    # all-zero rows: the exported graph needs an example input, and no real row may be logged
    example = np.zeros((2, *row_shape), dtype=row_dtype)  # 2 rows: batch size stays dynamic
    with mlflow.start_run(run_id=run_id):
        if transcript is None and preprocessing is not None:
            info = log_served_model(model, preprocessing, name)
        elif transcript is None:
            info = mlflow.pytorch.log_model(
                model.cpu(), name=MODEL_ARTIFACT, pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],
                input_example=example, registered_model_name=name)
        else:  # the signature from the trained model's output, so logging replays nothing
            was_training = model.training
            with torch.no_grad():
                output = model.eval()(torch.from_numpy(example).to(next(model.parameters()).device)).cpu().numpy()
            model.train(was_training)
            info = log_transcript_model(transcript, example, output, name, preprocessing)
    client = mlflow.MlflowClient(tracking_uri)
    version = str(info.registered_model_version)
    sizes = {}
    if transcript is not None:  # what it weighs against the weights it stands for
        sizes = {PRIVZO_REGISTER: "transcript", PRIVZO_TRANSCRIPT_BYTES: str(len(transcript.to_json().encode())),
                 PRIVZO_WEIGHTS_BYTES: str(weights_bytes(model))}
    for key, value in {**tags, **sizes}.items():  # registered models carry the DP tags
        client.set_model_version_tag(name, version, key, value)
    if description:  # with the command that checks it against the ledger and the run (flows/record/verify.py)
        if transcript is not None:
            description += "\n\n" + reporting.transcript_paragraph(
                name, version, len(transcript.journal), transcript.start, int(sizes[PRIVZO_TRANSCRIPT_BYTES]),
                int(sizes[PRIVZO_WEIGHTS_BYTES]), transcript.directions_stream)
        description = f"{description}\n\n{reporting.verify_hint(name, version, tracking_uri, charged)}"
        client.update_model_version(name, version, description=description)
        client.update_registered_model(name, description=reporting.registered_model_description(
            name, version, description))
    return version


def result_summary(spec: specs.RunSpec, result: Dict[str, Any], markdown: bool) -> list:
    """The run's summary lines (``flows.record.reporting.result_summary``), with its MLflow addresses."""
    uri, name, version = result["tracking_uri"], spec.name, result["model_version"]
    return reporting.result_summary(
        name, version, result, result["model_guarantee"], result["guarantee"], run_name=result["run_name"],
        run_id=result["run_id"], tracking_uri=uri, browse_command=ui_command(uri),
        run_link=run_url(uri, result["experiment_id"], result["run_id"]), version_link=version_url(uri, name, version),
        experiment=spec.tracking.experiment or name, experiment_link=experiment_url(uri, result["experiment_id"]),
        markdown=markdown)


def budget_table(budget: Budget) -> str:
    """The dataset's ledger as a markdown table (``flows.record.reporting.budget_table``): every run's epsilon, the
    exact total and what a next run like the last still fits."""
    ledger, dataset = budget.ledger, budget.dataset
    ds = ledger.dataset(dataset)
    spent = ledger.spent(dataset)
    where = ledger.engine.url.render_as_string(hide_password=True)  # a team ledger's URL may hold a password
    charges = [reporting.BudgetRow(c.run_id, ledger.run_epsilon(c), c.steps_run, c.steps_planned, c.status,
                                   c.created_at, c.run_name) for c in ledger.history(dataset)]
    return reporting.budget_table(dataset, where, ds.delta, ds.accountant, ds.neighboring, ds.lifetime_epsilon, spent,
                                  charges, ledger.next_fit(dataset))


@task(name="reopen-run", cache_policy=NO_CACHE, retries=2)
def reopen_run(tracking_uri: str, run_id: str, step: int) -> None:
    client = mlflow.MlflowClient(tracking_uri)
    client.update_run(run_id, status="RUNNING")
    client.set_tag(run_id, PRIVZO_RESUMED_FROM_STEP, str(step))


NOMINAL_EPSILON_METRIC = "privacy/nominal_epsilon_not_private"


def epsilon_metric(spec: specs.RunSpec) -> Optional[str]:
    """The metric a run's spent epsilon is logged under: ``privacy/epsilon`` only where it is a guarantee.
    An insecure_deterministic run's is nominal and logged under a name that says so; mechanism none has none."""
    if spec.privacy is None:
        return None
    return "privacy/epsilon" if spec.private else NOMINAL_EPSILON_METRIC


@dataclass(frozen=True)
class Spent:
    """What a run spent and guarantees, as logged to its MLflow run."""
    summary: PrivacySummary
    tags: Dict[str, str]
    model_guarantee: str  # the model's: this run's, or every run since a seed initialisation composed
    model_epsilon: float
    report: str
    trained_on: str


def log_spent(resolved: specs.RunSpec, window: Tuple[str, ...], data: SplitData, built: builders.Built, run_id: str,
              metrics: Dict[str, float], selection: Optional[str] = None) -> Spent:
    """Log the run's DP tags, DpEvent, privacy report and journal: what the steps executed so far spent.
    ``window``: with data.blocks, the blocks the run read. ``selection``: a tune winner's search."""
    uri = resolved.tracking.uri
    summary = privacy_summary(resolved, built, selection)
    tags = {**dp_tags(summary, data.private.fingerprint), PRIVZO_DIRECTIONS_VERSION: str(GENERATOR_VERSION),
            PRIVZO_DIRECTIONS_STREAM: built.loop.backend.directions.stream}
    client = mlflow.MlflowClient(uri)
    composed = model_event(client, run_id, resolved, built.loop.tracker.event())
    model_eps = model_epsilon(resolved, composed)
    by_block = None
    if window:  # the model's guarantee is its largest block's, not the composition over blocks
        by_block = model_block_events(client, run_id, window, built.loop.tracker.event(), composed)
        per_block = {b: model_epsilon(resolved, e) for b, e in (by_block or {}).items()}
        model_eps = max(per_block.values()) if per_block else math.inf
        tags[PRIVZO_BLOCKS] = ",".join(window)
    tags[DP_MODEL_EPSILON] = shown(model_eps, 6)
    started = client.get_run(run_id).data.tags.get(PRIVZO_INIT, "seed")
    continued = started.startswith("models:/")
    tags[DP_MODEL_RUNS] = str(model_runs(client, run_id) if continued else 1)
    model_sentence = (summary.model_guarantee(
        model_eps, int(tags[DP_MODEL_RUNS]), started, blocks=len(by_block or {}),
        person_level=bool(resolved.data.blocks and resolved.data.blocks.person)) if continued else summary.guarantee())
    report = privacy_report(summary, {k: v for k, v in metrics.items() if not math.isnan(v)},
                            model=model_sentence if continued else None)
    trained_on = _trained_on(resolved, data, summary.steps, started)
    tags[DESCRIPTION] = reporting.run_description(summary.guarantee(), trained_on,
                                                  model_sentence if continued else None)
    if continued:
        report += reporting.initialisation_paragraph(started, tags[DP_MODEL_EPSILON], composed is not None)
    extra = {MODEL_EVENT_ARTIFACT: event_to_json(composed)} if composed is not None else {}
    if by_block is not None:
        extra[MODEL_BLOCK_EVENTS_ARTIFACT] = json.dumps({b: event_to_json(e) for b, e in sorted(by_block.items())})
    log_privacy(uri, run_id, tags, report, event_to_json(built.loop.tracker.event()),
                journal_json(built.loop.journal), extra)
    return Spent(summary, tags, model_sentence, model_eps, report, trained_on)


def register(resolved: specs.RunSpec, data: SplitData, built: builders.Built, run_id: str, spent: Spent) -> str:
    """Register the model, its version headed by the model's guarantee with the run's spend beside it; with
    ``tracking.register_as: transcript``, its transcript, once a replay has rebuilt the trained weights from it."""
    tags = spent.tags
    version_tags = {k: v for k, v in tags.items() if k != DESCRIPTION}
    version_tags.update({  # a version is the model: its headline is the model's guarantee, the run's spend beside it
        DP_EPSILON: tags[DP_MODEL_EPSILON] if resolved.private else tags[DP_EPSILON],
        DP_GUARANTEE: spent.model_guarantee, DP_RUN_EPSILON: tags[DP_EPSILON],
        DP_RUN_GUARANTEE: tags[DP_GUARANTEE]})
    transcript = None
    if resolved.tracking.register_as == "transcript":
        init = mlflow.MlflowClient(resolved.tracking.uri).get_run(run_id).data.tags.get(PRIVZO_INIT)
        transcript = transcript_of(resolved, built.model, built.loop.journal, built.loop.backend.directions.stream,
                                   run_id, init, (data.n_features, data.n_classes))
        problem = replays_to(transcript, built.model, resolved.tracking.uri)
        if problem:  # never register a transcript that loads as other weights: the trained ones are at hand
            get_run_logger().warning("tracking.register_as: transcript: %s; registering the weights instead", problem)
            transcript = None
    return register_model(resolved.tracking.uri, run_id, built.model, data.test.features.shape[1:],
                          str(data.test.features.dtype), resolved.name, version_tags,
                          description=reporting.version_description(spent.model_guarantee, run_id,
                                                                    spent.summary.guarantee(), spent.trained_on),
                          transcript=transcript, charged=resolved.budget is not None,
                          preprocessing=data.preprocessing)


def _trained_on(spec: specs.RunSpec, data: SplitData, steps: int, started: str) -> str:
    """What a model was trained on and how, in a sentence (``flows.record.reporting.trained_on``; no private count
    under add/remove)."""
    source = spec.data.source
    return reporting.trained_on(
        spec.name, spec.estimator.kind, spec.mechanism.kind, spec.sampling.kind, steps, source.kind, source.name,
        len(data.public), len(data.test), started,
        private_rows=len(data.private) if spec.private_count_is_public else None,
        declared_private_rows=spec.data.declared_private_rows)


def artifact_key(name: str) -> str:
    # Prefect artifact keys allow lowercase letters, digits and dashes only
    return "privacy-report-" + "".join(c if c.isalnum() else "-" for c in name.lower())
