"""``private_train``: resolve -> load and split -> calibrate sigma -> reserve budget -> train in
checkpointed chunks -> evaluate -> log -> register -> commit budget.

Reads like the algorithm: every computation is a component; the steps it shares with the search are
``flows.tasks``', what the run writes to MLflow is ``flows.record.registration``'s, where it starts from
``flows.record.lineage``'s, how a killed run is found again ``flows.resume``'s and what counts as a refusal
``specs.refusal``'s. A chunk of training draws DP noise: it is never cached; a failed chunk is retried
from the last checkpoint, and the steps the failed attempt spent stay charged. A process killed mid-run
resumes from its last checkpoint under the same ledger reservation and MLflow run, charged with every step
of the chunk it was killed in. A private run's noise was calibrated for
``optimizer.steps`` private steps in all, so the steps a rewind discards come out of the trajectory: the
run ends that many updates early, at exactly the planned epsilon, never above it.

The run's ledger reservation and checkpoint folder are one ``flows.session.RunSession``: however the run
ends, the ledger is settled once (the steps executed committed, a reservation kept for ``--resume`` after a
lost cluster, or released when nothing private ran). Report and guarantee text is ``flows.record.reporting``'s.
"""
from __future__ import annotations

import dataclasses
import sys
import uuid
from typing import Any, Dict, Optional

import mlflow
import torch
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.states import Failed
from mlflow.entities import RunTag

import specs
from components import builders
from components.data import SplitData
from components.protocols import Finalizing, Periodic
from flows.checkpoints import Checkpointer
from flows.record import reporting
from flows.record.lineage import registered_source
from flows.record.registration import (artifact_key, budget_table, epsilon_metric, log_metrics, log_spent, open_run,
                                       register, reopen_run, result_summary)
from flows.record.reporting import shown, shown_left
from flows.record.tracking import released_fingerprint, tool
from flows.record.tracking_names import DP_BUDGET_LEFT, PRIVZO_INIT
from flows.record.transcript import load_weights
from flows.resume import checkpoint_binding, find_checkpoint, run_window, same_stream
from flows.session import RunSession
from flows.tasks import (Plan, RunLedger, calibrate, charged_to_the_team_ledger, evaluate, open_budget,
                         load_and_split, load_run_spec)
from flows.window import BlockView
from specs.refusal import checking_input, is_refusal, quiet_refusals, refusal_line


@task(name="public-warm-start", cache_policy=NO_CACHE, retries=0)
def public_warm_start(spec: specs.RunSpec, built: builders.Built) -> int:
    """Plain training on public rows before the private phase (no privacy cost)."""
    return builders.public_warm_start(spec, built)


def _worth_retrying(_task, _task_run, state) -> bool:
    """A chunk that diverged (NaN or inf parameters or releases) would diverge again on retry and only
    spend more of the budget; crashes of workers or stores are retried."""
    from components.runtime.loop import NonFiniteError

    from flows.ledger.leases import LeaseLost

    err = getattr(state, "data", None)
    # a lost cluster stays lost for the seconds a retry takes; the run ends, and resumes once it is back. A
    # lost lease is final: the charge was settled
    return not isinstance(err, (NonFiniteError, LeaseLost)) and not cluster_lost(err)


def cluster_lost(err: Any) -> bool:
    """The Ray backend lost its cluster (looked up where it was loaded; ray is not imported for this)."""
    lost = getattr(sys.modules.get("components.runtime.ray_backend"), "ClusterLost", ())
    return bool(lost) and isinstance(err, lost)


@task(name="train-chunk", cache_policy=NO_CACHE, retries=2, retry_condition_fn=_worth_retrying)
def train_chunk(spec: specs.RunSpec, built: builders.Built, until: int, checkpointer: Checkpointer,
                progress=None) -> int:
    """Private steps up to ``until``, then a checkpoint. A retry starts from the last checkpoint."""
    loop = built.loop
    discarded = checkpointer.rewind(loop)
    until = min(until, trajectory_end(spec, loop))
    if discarded:
        get_run_logger().warning(
            "retrying from the checkpoint at step %d; the %d steps of the failed attempt stay charged (%d privacy "
            "steps spent) and come out of the run's remaining steps: it now ends at step %d", loop.step, discarded,
            loop.tracker.steps, trajectory_end(spec, loop))
    if progress is not None:
        progress.n, progress.total = loop.step, trajectory_end(spec, loop)
        progress.refresh()
    start = loop.step
    builders.restart_insecure_streams(spec, built)
    checkpointer.begin(loop, until)
    loop.run(until, on_step=(lambda _s: progress.update(1)) if progress is not None else None)
    checkpointer.save(loop)
    return loop.step - start


def trajectory_end(spec: specs.RunSpec, loop) -> int:
    """The step a run stops at. A private run may spend ``optimizer.steps`` private steps in all (its
    noise was calibrated for that many): steps discarded by a retry or charged to a killed process
    shorten its trajectory instead of raising its epsilon."""
    if loop.finished:  # the KL paper's optimizers stop on their own (phases done, the filter's budget spent)
        return loop.step
    if not spec.private:
        return spec.optimizer.steps
    return loop.step + max(0, spec.optimizer.steps - loop.tracker.steps)


@task(name="initial-weights", cache_policy=NO_CACHE, retries=2)
def initial_weights(spec: specs.RunSpec, built: builders.Built, source: Optional[Dict[str, str]]) -> Dict[str, str]:
    """Load the registered version found by ``registered_source`` into the model (and its replicas)."""
    if source is None:
        return {PRIVZO_INIT: "seed" if spec.optimizer.init == "seed" else "seed (no registered version yet)"}
    # a transcript version is replayed, a weights version loaded as logged
    model = load_weights(source[PRIVZO_INIT], tracking_uri=spec.tracking.uri)
    builders.load_weights(built, model.state_dict())
    get_run_logger().info("initialised from %s", source[PRIVZO_INIT])
    return source


@flow(name="private-train", log_prints=True, validate_parameters=True)
def private_train(spec_path: Optional[str] = None, spec: Optional[Dict[str, Any]] = None,
                  progress: bool = False, resume: Optional[str] = None, as_of: Optional[str] = None) -> Dict[str, Any]:
    """Train a model under differential privacy as declared by one run spec (a YAML path or a mapping).

    ``resume``: the run key of a killed run (its checkpoint folder name) or ``latest``; by default a
    retried flow run resumes its own checkpoint. ``as_of``: with data.blocks, the moment whose window the run
    reads (ISO 8601; default: the flow run's scheduled start). A refusal ends the flow run Failed with its
    line as the state's message; called in-process, the refusal is raised.
    """
    quiet_refusals()
    try:
        return _private_train(spec_path, spec, progress, resume, as_of)
    except Exception as err:
        if is_refusal(err):
            return Failed(message=refusal_line(err), data=err)
        raise


def _private_train(spec_path: Optional[str], spec: Optional[Dict[str, Any]], progress: bool,
                   resume: Optional[str], as_of: Optional[str] = None) -> Dict[str, Any]:
    with checking_input():
        run_spec = load_run_spec(spec_path, spec)
        run_spec = charged_to_the_team_ledger(run_spec)
        if run_spec.tune is not None:  # its sigma is calibrated for a search that only the tune flow runs
            raise ValueError("tune: this spec searches its hyperparameters; run it with privzo tune (the private-tune "
                             "flow), or remove its tune section to train it as written")
        from components.memory_plan import check_fits
        check_fits(run_spec)  # a model sized by its config that cannot fit the device: refused before any row
        # the run's one handle on its budget: a caller the ledger does not sign in, or may not charge, reads no row
        budget = open_budget(run_spec)
        # chosen before any row is read, from the schedule and the calendar; a resumed run reads its own
        view = None if run_spec.data.blocks is None else BlockView(
            run_spec, run_window(run_spec, as_of, resume, budget), budget.ledger)
    if run_spec.execution.threads:
        torch.set_num_threads(run_spec.execution.threads)
    data = load_and_split(run_spec, view)
    plan = calibrate(run_spec, data)
    if view is not None:
        plan = dataclasses.replace(plan, window=view.window.blocks)
    resolved = plan.spec
    uri = resolved.tracking.uri
    # checkpoints bind to the keyed fingerprint: a plain hash of the private rows is never stored
    # (docs/design.md, Privacy invariants)
    fingerprint = released_fingerprint(data.private.fingerprint)
    store, saved = find_checkpoint(plan.spec, fingerprint, resume, budget, legacy=data.private.fingerprint)
    session = RunSession(store, RunLedger(plan, data, budget, view), charge_id=saved["charge_id"] if saved else None,
                         resumed=saved is not None, keep=resolved.checkpoint.keep, resumable=cluster_lost)
    with session:  # settles the reservation and the folder exactly once, however this block is left
        with checking_input():  # before any private step: the spec, the data or the start does not fit
            source = None if saved else registered_source(resolved, budget)
            if not saved and resolved.budget is not None:
                session.reserve(str(uuid.uuid4()))
            built = builders.build_loop(resolved, data)
            if saved:
                same_stream(store, saved, built.loop.backend.directions.stream)
            init_tags = {} if saved else initial_weights(resolved, built, source)
        session.start(built.loop, run_id=saved["run_id"] if saved else None)
        if saved:
            run_id = saved["run_id"]
            reopen_run(uri, run_id, saved["loop"]["step"])
            built.loop.load_state_dict(saved["loop"], restore_privacy_steps=True)
        else:
            run_id = open_run(resolved, plan.sampling_rate, data, built.loop.backend.directions.dim, str(built.device))
        checkpointer = Checkpointer(store, checkpoint_binding(resolved, fingerprint, session.charge_id, run_id, built, view),
                                    saved["loop"] if saved else None, bound=session.bound)
        session.track(checkpointer, run_id)
        get_run_logger().info("run key %s: checkpoints in %s (after a crash: %s run %s --resume %s)",
                              store.key, store.dir, tool("privzo"), spec_path or "SPEC", store.key)
        result, report = _train_and_log(plan, data, built, run_id, checkpointer, init_tags, progress=progress)
        left = session.commit()
    result["run_key"] = store.key
    table = ""
    if session.charge_id is not None:
        result["budget_left"] = left
        mlflow.MlflowClient(uri).set_tag(run_id, DP_BUDGET_LEFT, shown_left(left, 6))
        table = budget_table(budget)
    for line in result_summary(resolved, result, markdown=False):
        get_run_logger().info("%s", line)
    create_markdown_artifact(reporting.run_artifact(result_summary(resolved, result, markdown=True), table, report),
                             key=artifact_key(resolved.name), description="privzo run: MLflow links, guarantee, budget")
    return result


def _train_and_log(plan: Plan, data: SplitData, built: builders.Built, run_id: str, checkpointer: Checkpointer,
                   init_tags: Dict[str, str], *, progress: bool):
    """Train in checkpointed chunks, log as we go, and register the model; returns (result, privacy report
    markdown). What was spent is logged to the MLflow run whatever happened; a run that did not complete is
    marked FAILED and registers nothing."""
    resolved = plan.spec
    uri = resolved.tracking.uri
    if init_tags:  # a new run (a resumed one's checkpoint holds its initial and warm-started weights)
        mlflow.MlflowClient(uri).log_batch(run_id, tags=[RunTag(k, v) for k, v in init_tags.items()])
        warm_steps = public_warm_start(resolved, built)
        # the model before any private step, on the test and public rows only: a baseline for every curve, and
        # a pretrained language model's zero-shot score
        start = {"public/warm_start_steps": warm_steps} if warm_steps else {}
        log_metrics(uri, run_id, {**start, **evaluate(built, data)}, 0)
        checkpointer.save(built.loop)  # step 0: binds this key to the reservation before any private query

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=trajectory_end(resolved, built.loop), initial=built.loop.step,
                   desc=f"{resolved.name} private steps", unit="step", leave=False)
    metrics: Dict[str, float] = {}  # the latest evaluation: a failed run's report shows it too
    mlflow_status = "FAILED"
    try:
        _train_in_chunks(plan, data, built, run_id, checkpointer, bar, metrics)
        mlflow_status = "FINISHED"
    finally:
        # whatever happened, record what was spent: the steps executed are the privacy cost
        if bar is not None:
            bar.close()
        built.loop.backend.close()  # Ray workers hold private rows: stop them with the run
        spent = log_spent(resolved, plan.window, data, built, run_id, metrics)
        if mlflow_status != "FINISHED":
            mlflow.MlflowClient(uri).set_terminated(run_id, "FAILED")
    version = register(resolved, data, built, run_id, spent)
    mlflow.MlflowClient(uri).set_terminated(run_id, "FINISHED")
    client = mlflow.MlflowClient(uri)
    run = client.get_run(run_id)
    # the evaluation before any private step, as MLflow holds it (a resumed run logged it in its first process)
    before = {k: at[-1].value for k in run.data.metrics if k.startswith("eval/")
              if (at := [m for m in client.get_metric_history(run_id, k) if m.step == 0])}
    summary = spent.summary
    return {
        "run_id": run_id, "experiment_id": run.info.experiment_id, "tracking_uri": uri, "run_name": run.info.run_name,
        "epsilon": summary.epsilon, "delta": summary.delta, "target_epsilon": summary.target_epsilon,
        "noise_multiplier": summary.noise_multiplier, "steps": summary.steps, "guarantee": summary.guarantee(),
        "model_guarantee": spent.model_guarantee, "model_epsilon": spent.model_epsilon, "model_version": version,
        "blocks": list(plan.window), "before": before, **metrics,
    }, spent.report


def _train_in_chunks(plan: Plan, data: SplitData, built: builders.Built, run_id: str, checkpointer: Checkpointer,
                     bar, metrics: Dict[str, float]) -> None:
    """Private steps to the trajectory's end, one checkpointed chunk at a time, evaluated and logged every
    ``tracking.log_every`` steps and at the end; ``metrics`` always holds the latest evaluation."""
    resolved = plan.spec
    uri = resolved.tracking.uri
    log_every = resolved.tracking.log_every
    every = resolved.checkpoint.every or log_every
    chunk = train_chunk.with_options(retries=resolved.checkpoint.retries)

    def evaluate_and_log() -> None:
        """The model's metrics now, with the privacy spent so far, logged at the current step."""
        out = evaluate(built, data)
        if epsilon_metric(resolved):
            out[epsilon_metric(resolved)] = float(shown(built.loop.tracker.epsilon(), 6))  # never below the spend
        log_metrics(uri, run_id, out, built.loop.step)
        metrics.clear()
        metrics.update(out)

    # a run of running sums (a tree, 002's multi-pass releases, their twins) checkpoints only between
    # periods: the un-noised running sum and the live node noise exist only inside a period and are
    # never written, and a rewind restarts the sum at a period's first step
    period = built.loop.mechanism.period if isinstance(built.loop.mechanism, Periodic) else 1
    while built.loop.step < trajectory_end(resolved, built.loop):
        step = built.loop.step
        until = min((step // every + 1) * every, (step // log_every + 1) * log_every)
        until = min(trajectory_end(resolved, built.loop), -(-until // period) * period)
        chunk(resolved, built, until, checkpointer, bar)  # a retry inside may end the run earlier
        if built.loop.step // log_every > step // log_every or built.loop.step >= trajectory_end(resolved,
                                                                                                  built.loop):
            evaluate_and_log()
    if isinstance(built.loop.backend.optimizer, Finalizing):  # O2NC: the output is the window's average
        built.loop.backend.optimizer.finalize()
        evaluate_and_log()
    if not metrics:  # resumed from a checkpoint that already held every step: evaluate what it holds
        evaluate_and_log()


