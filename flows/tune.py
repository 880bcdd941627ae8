"""``privzo tune``: hyperparameters chosen inside the guarantee (components/tuning.py says why it holds).

The flow: the spec's rows are loaded and split once; sigma is calibrated so that the best of K candidates
meets privacy.epsilon (RepeatAndSelectDpEvent, RDP); the ledger is charged once, with that event, before any
candidate reads a row; K and each candidate's setting are drawn from the operating system's randomness; every
candidate trains in memory and is scored on rows that are not private; only the winner is released: an MLflow
parent run for the search (its space, K's law, the guarantee: never K, never a loser's setting or score) with
one child run, the winner's (its setting, its curve, its model, registered like any run). A losing
candidate's metrics, model and curve stay in this process's memory and are dropped with it; nothing of it is
logged, printed or written. Who sees the flow run's duration or the worker's process table can estimate K,
unless tune.pad_to pads every share of candidates to the same time (``tune_candidates.best_of_share``): docs/guide/tuning.md
says what stays visible.
"""
from __future__ import annotations

import dataclasses
import json
import secrets
import uuid
from typing import Any, Callable, Dict, List, Optional

import dp_accounting
import mlflow
from mlflow.entities import Param, RunTag
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Failed

import specs
from components import builders
from components.data import SplitData
from components.tuning import RepeatLaw, better, candidate_spec, draw_candidates
from flows.session import NO_FOLDER, RunSession
from flows.tasks import (RunLedger, calibrate, charged_to_the_team_ledger, open_budget, load_and_split,
                         load_run_spec)
from specs.refusal import checking_input, is_refusal, quiet_refusals, refusal_line
from flows.resume import run_window
from flows.window import BlockView
from flows.record.registration import log_metrics, log_spent, open_run, register
from flows.record.tracking import training_experiment
from flows.record.tracking_names import DP_EPSILON, DP_GUARANTEE, MLFLOW_PARENT_RUN_ID, TUNE, TUNE_PICKED_BY
from flows import tune_candidates as candidates
from flows.tune_rehearsal import rehearse



@task(name="tune-candidates", cache_policy=NO_CACHE, retries=0)
def run_candidates(search: specs.RunSpec, data: SplitData, started: Callable[[], None]) -> Optional[candidates.Candidate]:
    """Draw K and the settings, train each candidate, keep the best (None when K = 0 or none finished). K is
    never returned, logged or printed. With execution.backend ray the candidates are dealt among
    execution.workers Ray tasks (``candidates_on_ray``), each training its share in-process on rows it reads
    itself; otherwise they run here one after another. A candidate that raises is a loser
    (it never wins; its failure is not released), so K's law is unchanged; a task lost with its worker or node
    is run again by Ray, which draws fresh noise for a run whose output never left it. ``started()`` is called
    once no refusal can come before a candidate runs: from then on the search is charged whole."""
    settings = draw_candidates(search.tune, secrets.SystemRandom())
    if search.execution.backend == "ray":
        return candidates_on_ray(search, settings, data, started)
    started()
    return candidates.best_of_share(search, settings, data, candidates.padded_share(search, 1))


def _results_on_ray(search: specs.RunSpec, settings: List[Dict[str, Any]], data: SplitData):
    """A rehearsal's settings, each trained as a Ray task on the rehearsal's rows (public rows only, sent with the
    tasks): yields (setting, its task's result), one at a time."""
    from components.runtime.ray_tasks import each_on_ray

    execution, local = search.execution, candidates.in_process(search)
    for (_, setting), result in each_on_ray(candidates.trained_in_task, [(local, s) for s in settings], data,
                                             address=execution.address, workers=execution.workers,
                                             cpus_per_worker=execution.cpus_per_worker):
        yield setting, result


def _every_setting(search: specs.RunSpec, settings: List[Dict[str, Any]], data: SplitData) -> List[Optional[tuple]]:
    """Every setting's (scores, curve), or None where it raised: a rehearsal's, whose rows are all public (what
    a failure raised is logged). Ray tasks with execution.backend ray, else one after another here."""
    if search.execution.backend == "ray":
        return [result for _, result in _results_on_ray(search, settings, data)]
    trained = []
    for setting in settings:
        try:
            candidate = candidates.train_candidate(search, setting, data)
            trained.append((candidate.scores, candidate.curve))
        except Exception as err:  # noqa: BLE001 - public rows only: what it raised may be said
            get_run_logger().warning("tune rehearsal: the setting %s failed: %s", setting, err)
            trained.append(None)
    return trained


def candidates_on_ray(search: specs.RunSpec, settings: List[Dict[str, Any]], data: SplitData,
                      started: Callable[[], None]) -> Optional[candidates.Candidate]:
    """The private search on Ray: always execution.workers tasks, whatever K (so how many tasks ran says nothing
    of it), the candidates dealt among them in turn; each reads the rows itself and returns its share's best.
    A task a worker first reads the rows and matches the driver's digest, and only then is the search started:
    rows that changed since the driver's read are refused with nothing charged (a task that still reads other
    rows after that refuses too, the search charged whole: its other tasks drew noise). The winner is rebuilt
    here from its state: its trajectory on this process's rows."""
    from components.runtime.ray_tasks import each_on_ray
    from components.runtime.workers import DataChanged

    def start(matched: List[bool]) -> None:
        if not all(matched):
            raise DataChanged(candidates.CHANGED_ROWS)
        started()

    execution, local = search.execution, candidates.in_process(search)
    shares = [(local, settings[i::execution.workers]) for i in range(execution.workers)]
    read = (local.model_dump(mode="json"), data.window_rows, data.ordered_digest)
    best = None
    for _, result in each_on_ray(candidates.share_in_task, shares, read, address=execution.address, workers=execution.workers,
                                 cpus_per_worker=execution.cpus_per_worker, check=candidates.rows_match, ready=start):
        if result == candidates.ROWS_CHANGED:
            raise DataChanged(candidates.CHANGED_ROWS)
        if result is not None and (best is None or better(search.tune.score.metric, result[1], best[1])):
            best = result
        del result  # a share's curve and state go with it
    if best is None:
        return None
    setting, score, curve, state = best
    spec = candidate_spec(local, setting)
    built = builders.build_loop(spec, data, selected_by=search.tune)
    built.loop.load_state_dict(state, restore_privacy_steps=True)
    return candidates.Candidate(setting, spec, built, score, curve)


def selection_sentence(search: specs.RunSpec) -> str:
    tune = search.tune
    law = RepeatLaw(tune.candidates)
    return (f"the best of K candidates, K ~ {law.describe()} drawn from the operating system's randomness and "
            f"never released, each a run of this spec with a setting drawn uniformly from {len(tune.settings())} "
            f"settings of {', '.join(tune.space)} and scored by {tune.score.metric} on the {tune.score.split} rows; "
            "only this one was released")


def _parent_run(search: specs.RunSpec) -> str:
    """The search's MLflow parent run: the space, K's law and the score, never K or a loser's anything."""
    client = mlflow.MlflowClient(search.tracking.uri)
    experiment_id = training_experiment(client, search.tracking.experiment or search.name)
    tune = search.tune
    run = client.create_run(experiment_id, run_name=f"{search.name}-tune", tags={TUNE: "search"})
    client.log_batch(run.info.run_id, params=[
        Param("tune.space", json.dumps(tune.space, sort_keys=True)),
        Param("tune.candidates", RepeatLaw(tune.candidates).describe()),
        Param("tune.score", f"{tune.score.metric} on {tune.score.split}"),
        Param("privacy.epsilon", str(search.privacy.epsilon)), Param("privacy.delta", str(search.privacy.delta)),
        Param("mechanism.noise_multiplier", repr(float(search.mechanism.noise_multiplier)))])
    return run.info.run_id


@flow(name="private-tune", log_prints=True, validate_parameters=True)
def private_tune(spec_path: Optional[str] = None, spec: Optional[Dict[str, Any]] = None,
                 as_of: Optional[str] = None) -> Dict[str, Any]:
    """Choose a spec's hyperparameters under differential privacy (its ``tune`` section) and release only the
    winner, registered like any run; privacy.epsilon is the winner's, the search included. With data.blocks
    the search reads one night's window (``as_of``, default the flow run's scheduled time) and its event is
    charged to every block of it, admitted as any run's. A refusal ends the flow run Failed with its line as
    the state's message; called in-process, the refusal is raised."""
    quiet_refusals()
    try:
        return _private_tune(spec_path, spec, as_of)
    except Exception as err:
        if is_refusal(err):
            return Failed(message=refusal_line(err), data=err)
        raise


def _private_tune(spec_path: Optional[str], spec: Optional[Dict[str, Any]], as_of: Optional[str]) -> Dict[str, Any]:
    with checking_input():
        loaded = load_run_spec(spec_path, spec)  # as written: a rehearsal's private stage starts from it
        run_spec = charged_to_the_team_ledger(loaded)
        if run_spec.tune is None:
            raise ValueError("tune: this spec has no tune section; give tune.space and tune.candidates "
                             "(docs/guide/tuning.md), or train it with privzo run")
        budget = open_budget(run_spec)  # the search's one handle on its budget
        # a night's search reads its window, chosen before any row is read as a training run's is
        view = None if run_spec.data.blocks is None else BlockView(
            run_spec, run_window(run_spec, as_of, None, budget), budget.ledger)
    data = load_and_split(run_spec, view)
    plan = calibrate(run_spec, data)
    if view is not None:
        plan = dataclasses.replace(plan, window=view.window.blocks)
    search = plan.spec
    if search.tune.rows == "public":
        # its record of nothing held as any run holds its reservation: renewed while it trains (a rehearsal
        # outlasts a lease), committed once, aborted if it fails; no private row is read inside
        nothing = dp_accounting.NoOpDpEvent()
        ledger = RunLedger(plan, data, budget, view, charged=lambda _loop: (nothing, 0), planned=nothing)
        with RunSession(NO_FOLDER, ledger) as session:
            if search.budget is not None:
                session.reserve(str(uuid.uuid4()))
            rehearsal = rehearse(search, data, plan, _every_setting)
            session.start(None, rehearsal["parent_run_id"])
        if search.tune.then == "none" or rehearsal["best"] is None:
            return rehearsal
        return {**rehearsal, "then": _private_stage(loaded, rehearsal, as_of)}
    planned = builders.planned_event(search, plan.n_private, float(search.mechanism.noise_multiplier))
    # the search's reservation, settled once however it ends: released while no candidate could run (workers
    # not ready), else its planned event charged whole (every candidate K held drew noise), winner or not
    ledger = RunLedger(plan, data, budget, view, charged=lambda _loop: (planned, search.optimizer.steps))
    with RunSession(NO_FOLDER, ledger) as session:
        if search.budget is not None:
            session.reserve(str(uuid.uuid4()))
        get_run_logger().info("tune: sigma %.6g for the search (privacy.epsilon %s, the selection included); "
                              "candidates run in memory, only the winner is logged",
                              float(search.mechanism.noise_multiplier), search.privacy.epsilon)
        best = run_candidates(search, data, started=lambda: session.start(None))
        parent = _parent_run(search)
        session.run_id = parent
        if best is None:  # K = 0 (Poisson): nothing trained, nothing released
            mlflow.MlflowClient(search.tracking.uri).set_terminated(parent, "FINISHED")
            get_run_logger().info("tune: no candidate ran (a Poisson K of 0); nothing is released")
            return {"parent_run_id": parent, "winner": None, "epsilon": float(plan.planned_epsilon)}
        child, final, spent, version = _release(search, plan, data, best, parent)
        session.run_id = child
    client = mlflow.MlflowClient(search.tracking.uri)
    return {"parent_run_id": parent, "run_id": child, "winner": best.setting, "score": best.score,
            "tracking_uri": search.tracking.uri, "experiment_id": client.get_run(child).info.experiment_id,
            "epsilon": float(spent.summary.epsilon), "guarantee": spent.model_guarantee, "model_version": version,
            "noise_multiplier": float(search.mechanism.noise_multiplier), **final}


def _private_stage(loaded: specs.RunSpec, rehearsal: Dict[str, Any], as_of: Optional[str]) -> Dict[str, Any]:
    """What follows a rehearsal (``tune.then``): its pick trained once (``train``: a private-train subflow of the
    spec with that setting and no tune section, calibrated and charged as any run), or a private search among
    its best settings (``search``, in this flow run: ``tune.among``, K from tune.candidates). The rehearsal read
    public rows only, so the choice is independent of the private rows and the stage's guarantee is its own. Its MLflow run is a
    child of the rehearsal's."""
    tune = loaded.tune
    if tune.then == "train":
        from flows.private_train import private_train

        # a subflow: the spec as written with the pick (no credential: a spec's URLs hold none); on a team's
        # worker it is the deployment's run too, charged to the worker's ledger
        picked = candidate_spec(loaded, rehearsal["best"]).model_dump(mode="json")
        result = {"kind": "train", **private_train(spec=picked, as_of=as_of)}
        run_id = result["run_id"]
    else:
        narrowed = loaded.model_dump(mode="json")
        narrowed["tune"].update(rows="private", then="none", among=rehearsal["top"])
        result = {"kind": "search", **_private_tune(None, narrowed, as_of)}
        run_id = result["parent_run_id"]
    client = mlflow.MlflowClient(loaded.tracking.uri)
    client.set_tag(run_id, MLFLOW_PARENT_RUN_ID, rehearsal["parent_run_id"])
    client.set_tag(run_id, TUNE_PICKED_BY, rehearsal["parent_run_id"])
    return result


def _release(search: specs.RunSpec, plan, data: SplitData, best: candidates.Candidate, parent: str):
    """The winner as any run is released: its child run under the search's, its curve, its spend (the
    search's, its tracker says so) and its registered version."""
    client = mlflow.MlflowClient(search.tracking.uri)
    # the winner's spec as logged: its setting, and the search it won (its planned event is the search's, the
    # ledger's; its lr and clip replay its journal), so privzo verify checks it as any run
    winner = best.spec.model_copy(update={"tune": search.tune})
    child = open_run(winner, plan.sampling_rate, data, best.built.loop.backend.directions.dim, str(best.built.device))
    client.set_tag(child, MLFLOW_PARENT_RUN_ID, parent)
    client.set_tag(child, TUNE, "winner")
    for step, metrics in best.curve:
        log_metrics(winner.tracking.uri, child, metrics, step)
    final = dict(best.curve[-1][1])
    spent = log_spent(winner, plan.window, data, best.built, child, final, selection=selection_sentence(search))
    version = register(winner, data, best.built, child, spent)
    client.set_terminated(child, "FINISHED")
    client.log_batch(parent, params=[Param(f"winner.{k}", str(v)) for k, v in best.setting.items()],
                     tags=[RunTag(DP_EPSILON, spent.tags[DP_EPSILON]), RunTag(DP_GUARANTEE, spent.model_guarantee)])
    client.set_terminated(parent, "FINISHED")
    return child, final, spent, version
