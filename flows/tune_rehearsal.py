"""``tune.rows: public``: a rehearsal of a search on the public rows only, before its budget is spent.

Every setting of the space (the grid, not a random K: nothing private is read, so nothing needs hiding) is
trained as a candidate of the private search would be, with the private search's steps and sigma, on three
quarters of the public rows, and scored on the held-out quarter (score.split public) or the test rows. The
private rows are split off at load and never reach a candidate. Every setting's score and curve is released:
an MLflow parent run tagged ``privzo.tune: rehearsal`` with one child run a setting, no model registered.
With a budget, the ledger records the rehearsal as a charge of nothing (a NoOpDpEvent), after the same row
checks a run passes (no public or test row may have been private in an earlier run): its history shows it.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

import dp_accounting
import mlflow
from mlflow.entities import Metric, Param
from prefect import get_run_logger

import specs
from components.accountants import event_to_json
from components.data import SplitData
from components.tuning import RepeatLaw, rehearsal_rows, rehearsal_spec
from flows.record.registration import log_metrics
from flows.record.tracking import training_experiment
from flows.record.tracking_names import MLFLOW_PARENT_RUN_ID, TUNE, TUNE_ROWS

REHEARSAL = "rehearsal"


def rehearse(search: specs.RunSpec, data: SplitData, plan, train, reserve, commit) -> Dict[str, Any]:
    """Train and score every setting of ``search`` (calibrated) on public rows: ``train(spec, settings, rows)``
    gives each setting's (score, curve) or None; ``reserve(planned)`` and ``commit(charge_id, event_json,
    run_id)`` record the rehearsal in the ledger (called with a budget only)."""
    logger = get_run_logger()
    rows = rehearsal_rows(data, search.seed)
    spec = rehearsal_spec(search, len(rows.private))
    nothing = dp_accounting.NoOpDpEvent()
    charge_id = reserve(nothing) if search.budget is not None else None
    seen = (f"public rows only: {len(rows.private)} trained on, {len(rows.public)} held out"
            + (", which score each setting" if search.tune.score.split == "public" else f", {len(rows.test)} test "
               "rows score each setting") + "; no private row was read by any setting")
    logger.info("tune rehearsal: %d settings on %s", len(search.tune.settings()), seen)
    settings = search.tune.settings()
    trained = train(spec, settings, rows)
    client = mlflow.MlflowClient(search.tracking.uri)
    experiment_id = training_experiment(client, search.tracking.experiment or search.name)
    parent = client.create_run(experiment_id, run_name=f"{search.name}-rehearsal",
                               tags={TUNE: REHEARSAL, TUNE_ROWS: seen}).info.run_id
    tune = search.tune
    client.log_batch(parent, params=[
        Param("tune.space", json.dumps(tune.space, sort_keys=True)),
        Param("tune.candidates", RepeatLaw(tune.candidates).describe()),
        Param("tune.score", f"{tune.score.metric} on {tune.score.split}"),
        Param("mechanism.noise_multiplier", repr(float(search.mechanism.noise_multiplier))),
        Param("optimizer.steps", str(spec.optimizer.steps)),
        Param("sampling.batch", str(spec.batch_size(len(rows.private))))])
    table: List[Dict[str, Any]] = []
    score_name = f"score/{tune.score.split}_{tune.score.metric}"
    for setting, result in zip(settings, trained):
        name = ", ".join(f"{k}={v}" for k, v in setting.items())
        child = client.create_run(experiment_id, run_name=name, tags={
            MLFLOW_PARENT_RUN_ID: parent, TUNE: REHEARSAL, TUNE_ROWS: seen}).info.run_id
        client.log_batch(child, params=[Param(k, str(v)) for k, v in setting.items()])
        score: Optional[float] = None
        if result is not None:
            score, curve = result
            for step, metrics in curve:
                log_metrics(search.tracking.uri, child, metrics, step)
            client.log_batch(child, metrics=[Metric(score_name, score, 0, curve[-1][0])])
        client.set_terminated(child, "FINISHED" if result is not None else "FAILED")
        table.append({"setting": setting, "score": score, "run_id": child})
    scored = [row for row in table if row["score"] is not None and row["score"] == row["score"]]
    best = None
    if scored:
        best = (max if tune.score.metric == "accuracy" else min)(scored, key=lambda row: row["score"])
        client.log_batch(parent, params=[Param(f"best.{k}", str(v)) for k, v in best["setting"].items()],
                         metrics=[Metric(score_name, best["score"], 0, 0)])
    client.set_terminated(parent, "FINISHED")
    if charge_id is not None:
        commit(charge_id, event_to_json(nothing), parent)
    return {"rehearsal": True, "parent_run_id": parent, "settings": table, "best": best and best["setting"],
            "score": best and best["score"], "rows": seen, "tracking_uri": search.tracking.uri,
            "experiment_id": experiment_id, "epsilon": 0.0, "private_search_epsilon": float(plan.planned_epsilon),
            "noise_multiplier": float(search.mechanism.noise_multiplier)}
