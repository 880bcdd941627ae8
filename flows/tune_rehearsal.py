"""``tune.rows: public``: a rehearsal of a search on the public rows only, before its budget is spent.

Every setting of the space (the grid, not a random K: nothing private is read, so nothing needs hiding) is
trained as the private stage would train it (its steps, its noise per example) once a fold of the public rows,
on the other folds, and scored on the held-out fold (score.split public) or the test rows; its score is the
mean over the folds, so every public row scores it once. The settings are ranked by the score's metric, ties
by the other (accuracy, loss), then by the space's order. The
private rows are split off at load and never reach a candidate. Every setting's score and curve is released:
an MLflow parent run tagged ``privzo.tune: rehearsal`` with one child run a setting, no model registered.
With a budget, the ledger records the rehearsal as a charge of nothing (a NoOpDpEvent, held by the caller's run
session as any run's reservation is, its lease renewed while it trains), after the same row
checks a run passes (no public or test row may have been private in an earlier run): its history shows it.
"""
from __future__ import annotations

import json
import time
from typing import Any, Dict, List, Optional

import mlflow
from mlflow.entities import Metric, Param
from prefect import get_run_logger

import specs
from components.data import SplitData
from components.tuning import RepeatLaw, ranked, rehearsal_rows, rehearsal_spec
from flows.record.tracking import training_experiment
from flows.record.tracking_names import MLFLOW_PARENT_RUN_ID, TUNE, TUNE_ROWS

REHEARSAL = "rehearsal"


def rehearse(search: specs.RunSpec, data: SplitData, plan, train) -> Dict[str, Any]:
    """Train and score every setting of ``search`` (calibrated) on public rows, once a fold:
    ``train(spec, settings, rows)`` gives each setting's (scores, curve) or None. Its record in the ledger (a
    NoOpDpEvent) is the caller's run session's."""
    logger = get_run_logger()
    tune = search.tune
    folds = [rehearsal_rows(data, search.seed, fold, tune.folds) for fold in range(tune.folds)]
    trained_on = sorted({len(rows.private) for rows in folds})
    held = sorted({len(rows.public) for rows in folds})
    seen = (f"public rows only: {len(data.public)} in {tune.folds} folds, each setting trained once a fold on "
            f"{_span(trained_on)} rows and scored on "
            + (f"the held-out {_span(held)}, every public row once" if tune.score.split == "public"
               else f"the {len(data.test)} test rows") + "; no private row was read by any setting")
    settings = tune.settings()
    logger.info("tune rehearsal: %d settings on %s", len(settings), seen)
    each: List[List[Optional[tuple]]] = [[] for _ in settings]
    sigmas = []
    for rows in folds:
        spec = rehearsal_spec(search, len(rows.private), plan.n_private)
        sigmas.append(float(spec.mechanism.noise_multiplier))
        for results, result in zip(each, train(spec, settings, rows)):
            results.append(result)
    client = mlflow.MlflowClient(search.tracking.uri)
    experiment_id = training_experiment(client, search.tracking.experiment or search.name)
    parent = client.create_run(experiment_id, run_name=f"{search.name}-rehearsal",
                               tags={TUNE: REHEARSAL, TUNE_ROWS: seen}).info.run_id
    client.log_batch(parent, params=[
        Param("tune.space", json.dumps(tune.space, sort_keys=True)),
        Param("tune.candidates", RepeatLaw(tune.candidates).describe() if tune.candidates else "none (then: train)"),
        Param("tune.score", f"{tune.score.metric} on {tune.score.split}"),
        Param("tune.folds", str(tune.folds)), Param("tune.then", tune.then),
        Param("mechanism.noise_multiplier", repr(float(search.mechanism.noise_multiplier))),
        Param("rehearsal.noise_multiplier", ", ".join(f"{s:.6g}" for s in sorted(set(sigmas)))),
        Param("optimizer.steps", str(search.optimizer.steps))])
    table: List[Dict[str, Any]] = []
    for setting, results in zip(settings, each):
        name = ", ".join(f"{k}={v}" for k, v in setting.items())
        child = client.create_run(experiment_id, run_name=name, tags={
            MLFLOW_PARENT_RUN_ID: parent, TUNE: REHEARSAL, TUNE_ROWS: seen}).info.run_id
        client.log_batch(child, params=[Param(k, str(v)) for k, v in setting.items()])
        scores: Optional[Dict[str, float]] = None
        if all(result is not None for result in results):
            per_fold = [result[0] for result in results]
            names = [k for k in per_fold[0] if all(k in s for s in per_fold)]
            scores = {k: sum(s[k] for s in per_fold) / len(per_fold) for k in names}
            _log_curve(client, child, results[0][1])  # the first fold's curve; every fold's score below
            _log_batches(client, child, [Metric(f"score/fold_{tune.score.split}_{k}", s[k], 0, fold)
                                         for fold, s in enumerate(per_fold) for k in names]
                         + [Metric(f"score/{tune.score.split}_{k}", v, 0, 0) for k, v in scores.items()])
        client.set_terminated(child, "FINISHED" if scores is not None else "FAILED")
        table.append({"setting": setting, "scores": scores, "run_id": child})
    order = ranked(table, tune.score.metric)
    for rank, row in enumerate(order, 1):
        row["rank"] = rank if row["scores"] is not None else None
    best = order[0] if order and order[0]["scores"] is not None else None
    if best is not None:
        client.log_batch(parent, params=[Param(f"best.{k}", str(v)) for k, v in best["setting"].items()],
                         metrics=[Metric(f"score/{tune.score.split}_{k}", v, 0, 0) for k, v in best["scores"].items()])
        logger.info("tune rehearsal: picked %s (%s %.4g on the %s rows, mean of %d folds)",
                    best["setting"], tune.score.metric, best["scores"][tune.score.metric], tune.score.split,
                    tune.folds)
    client.set_terminated(parent, "FINISHED")
    return {"rehearsal": True, "parent_run_id": parent, "settings": table, "ranked": order,
            "best": best and best["setting"], "score": best and best["scores"][tune.score.metric],
            "top": [row["setting"] for row in order[:tune.top] if row["scores"] is not None],
            "rows": seen, "tracking_uri": search.tracking.uri, "experiment_id": experiment_id, "epsilon": 0.0,
            "private_search_epsilon": float(plan.planned_epsilon),
            "noise_multiplier": float(search.mechanism.noise_multiplier), "rehearsal_noise_multipliers": sigmas}


def _span(values: List[int]) -> str:
    return str(values[0]) if len(values) == 1 else f"{values[0]}-{values[-1]}"


def _log_curve(client, run_id: str, curve) -> None:
    """A setting's curve straight to MLflow: public rows only, and no Prefect task a point (its lines would
    bury the rehearsal's table)."""
    now = int(time.time() * 1000)
    _log_batches(client, run_id, [Metric(k, float(v), now, step) for step, metrics in curve for k, v in metrics.items()])


def _log_batches(client, run_id: str, metrics: List[Metric]) -> None:
    for start in range(0, len(metrics), 1000):  # MLflow takes at most 1000 metrics a batch
        client.log_batch(run_id, metrics=metrics[start:start + 1000])
