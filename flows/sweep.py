"""``sweep``: one spec per estimator x epsilons x seeds, a parent MLflow run with a child run per cell,
a results table (mean +- std over seeds) and the privacy-utility plot.

Each cell is a complete private run of its own (calibrated for its epsilon, fresh OS-entropy noise);
cells share nothing private. Selecting hyperparameters by these results is outside every cell's
guarantee, as with any tuning on the data.

A cell that is not private (privacy.insecure_deterministic, or mechanism none) is marked so in every
output: its rows in the table and the CSV (column ``private``), its series in the plot, and its child
run's epsilon metric (``privacy/nominal_epsilon_not_private``, never ``privacy/epsilon``).
"""
from __future__ import annotations

import io
import os
import math
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, List, Optional

import mlflow
import torch
from mlflow.entities import Metric, Param, RunTag
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

import specs
from components import builders, models
from flows.private_train import epsilon_metric
from flows.reporting import summarize
from flows.tracking import dp_tags, log_text_artifacts


@task(name="sweep-cell", cache_policy=NO_CACHE, retries=0)
def run_cell(spec: specs.RunSpec, parent_run_id: str, experiment_id: str) -> Dict[str, Any]:
    """Train one cell to the end and log it as a child run; noise is drawn here, so never retried."""
    start = time.perf_counter()
    data = builders.load_data(spec)
    n = len(data.private)
    resolved, _rate, _planned = builders.plan(spec, data)
    built = builders.build_loop(resolved, data)
    builders.public_warm_start(resolved, built)
    built.loop.run(resolved.optimizer.steps)
    test = models.evaluate(built.model, torch.as_tensor(data.test.features, device=built.device),
                           torch.as_tensor(data.test.labels, device=built.device))
    seconds = time.perf_counter() - start  # loading, planning, warm start, training and evaluation
    eps = built.loop.tracker.epsilon()
    privacy = resolved.privacy
    summary = summarize(resolved, eps, built.loop.tracker.steps, built.loop.sampler,
                        built.loop.estimator.queries_per_step, rho=built.loop.tracker.rho(),
                        noise_source=getattr(built.loop.mechanism, "noise_source", "fast"))
    client = mlflow.MlflowClient()
    run = client.create_run(experiment_id, run_name=f"{resolved.name}-eps{privacy.epsilon if privacy else 'inf'}-s{resolved.seed}",
                            tags={"mlflow.parentRunId": parent_run_id, "privzo.estimator": resolved.estimator.kind})
    client.log_batch(run.info.run_id,
                     params=[Param(k, v) for k, v in specs.flatten(resolved).items()],
                     metrics=[Metric("eval/accuracy", test["accuracy"], 0, resolved.optimizer.steps),
                              Metric("eval/loss", test["loss"], 0, resolved.optimizer.steps),
                              Metric("time/seconds", seconds, 0, resolved.optimizer.steps)]
                     + ([Metric(epsilon_metric(resolved), eps, 0, resolved.optimizer.steps)]
                        if epsilon_metric(resolved) else []),
                     tags=[RunTag(k, v) for k, v in dp_tags(summary, data.private.fingerprint).items()])
    client.set_terminated(run.info.run_id, "FINISHED")
    return {"name": resolved.name, "estimator": resolved.estimator.kind, "epsilon": privacy.epsilon if privacy else math.inf,
            "seed": resolved.seed, "accuracy": test["accuracy"], "spent_epsilon": eps, "seconds": seconds,
            "private": resolved.private}


NOT_PRIVATE = "NOT private"


def _label(name: str, cells: List[Dict[str, Any]]) -> str:
    """A spec's name in the table and plot, marked where any of its cells is not private (an
    insecure_deterministic spec's epsilons are nominal)."""
    return name if all(c.get("private", True) for c in cells if c["name"] == name) else f"{name} ({NOT_PRIVATE})"


def results_csv(cells: List[Dict[str, Any]]) -> str:
    """One line per cell; ``seconds`` is the cell's wall time (empty if not measured); ``private`` false
    marks a cell whose epsilon is nominal or none."""
    return "name,estimator,epsilon,seed,accuracy,spent_epsilon,seconds,private\n" + "".join(
        f"{c['name']},{c['estimator']},{c['epsilon']},{c['seed']},{c['accuracy']:.6f},{c['spent_epsilon']:.6g},"
        f"{'' if c.get('seconds') is None else format(c['seconds'], '.1f')},"
        f"{str(c.get('private', True)).lower()}\n" for c in cells)


def results_table(cells: List[Dict[str, Any]], epsilons: List[float]) -> str:
    by = defaultdict(list)
    for c in cells:
        by[(c["name"], c["epsilon"])].append(c["accuracy"])
    names = list(dict.fromkeys(c["name"] for c in cells))
    # a mechanism none spec runs once per seed at epsilon inf: its own column, not a row of dashes
    columns = list(epsilons) + ([math.inf] if any(c["epsilon"] == math.inf for c in cells) else [])
    head = "| spec | " + " | ".join(f"ε = {e:g}" if math.isfinite(e) else "no DP" for e in columns) + \
        " | s / run |"
    lines = [head, "|---|" + "---|" * (len(columns) + 1)]
    for name in names:
        row = []
        for e in columns:
            accs = by.get((name, e), [])
            if not accs:
                row.append("–")
                continue
            if len(accs) == 1:  # one seed: no spread to state (a "± 0.0" would claim one)
                row.append(f"{100 * accs[0]:.1f}")
                continue
            row.append(f"{100 * statistics.mean(accs):.1f} ± {100 * statistics.stdev(accs):.1f}")
        times = [c["seconds"] for c in cells if c["name"] == name and c.get("seconds") is not None]
        row.append(f"{statistics.mean(times):.0f}" if times else "–")  # wall time of one cell, mean over cells
        lines.append(f"| {_label(name, cells)} | " + " | ".join(row) + " |")
    if any(not c.get("private", True) for c in cells):
        lines.append(f"\n{NOT_PRIVATE}: no (ε, δ) guarantee holds for a row so marked; an insecure_deterministic "
                     "row's ε is nominal (its noise and batches come from the public seed).")
    return "\n".join(lines) + "\n"


def utility_plot(cells: List[Dict[str, Any]], epsilons: List[float]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in dict.fromkeys(c["name"] for c in cells):
        means = [statistics.mean([c["accuracy"] for c in cells if c["name"] == name and c["epsilon"] == e] or [math.nan])
                 for e in epsilons]
        private = _label(name, cells) == name
        unbounded = [c["accuracy"] for c in cells if c["name"] == name and c["epsilon"] == math.inf]
        if unbounded:  # mechanism none: no epsilon to place it at
            ax.axhline(100 * statistics.mean(unbounded), linestyle="--", color="grey", label=_label(name, cells))
            continue
        ax.plot(epsilons, [100 * m for m in means], marker="o", label=_label(name, cells),
                linestyle="-" if private else ":")
    ax.set_xscale("log")
    ax.set_xlabel("ε (δ as each spec resolves it)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("privacy–utility")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def refusal(spec: specs.RunSpec) -> Optional[str]:
    """Why a spec cannot be swept as written (one line), or None. A sweep cell trains on the private rows
    but is charged to no ledger and starts from the seed, so a spec that promises either is refused
    rather than silently run differently."""
    if spec.budget is not None:
        return (f"sweep: {spec.name} is charged to dataset {spec.budget.dataset}'s lifetime budget, and sweep "
                "cells are charged to no ledger; sweep a copy without the budget section")
    if spec.optimizer.init != "seed":
        return (f"sweep: {spec.name} starts from the latest registered model (optimizer.init), sweep cells "
                "from the seed; sweep a copy with init: seed")
    return None


def argument_problem(epsilons: List[float], seeds: List[int], output: Optional[str]) -> Optional[str]:
    """Why the sweep's own arguments cannot run (one line), or None; checked before anything starts."""
    bad = [e for e in epsilons if not (math.isfinite(e) and e > 0)]
    if bad:
        return f"--epsilons: every epsilon must be a finite number > 0 (found {bad[0]:g})"
    if any(s < 0 for s in seeds):
        return f"--seeds: every seed must be an integer >= 0 (found {min(seeds)})"
    if output is not None:
        out = Path(output).absolute()
        if out.is_dir():
            return f"--out: {output} is a folder; give a file name for the table (e.g. {output}/table.md)"
        parent = out.parent
        while not parent.exists():
            parent = parent.parent
        if not parent.is_dir():
            return f"--out: cannot write {output} ({parent} is a file)"
        if not os.access(parent, os.W_OK):
            return f"--out: cannot write {output} ({parent} is not writable)"
    return None


@flow(name="sweep", log_prints=True)
def sweep(spec_paths: List[str], epsilons: List[float], seeds: List[int], tracking_uri: Optional[str] = None,
          experiment: str = "privzo-sweep", output: Optional[str] = None) -> Dict[str, Any]:
    """Run every spec at every epsilon and seed; returns the cells and the markdown table."""
    base_specs = [specs.load_spec(p) for p in spec_paths]  # all validated before anything runs
    problems = [p for p in map(refusal, base_specs) if p]
    if problems:
        raise specs.SpecError(problems[0])
    problem = argument_problem(epsilons, seeds, output)
    if problem:
        raise specs.SpecError(problem)
    uri = tracking_uri or base_specs[0].tracking.uri
    mlflow.set_tracking_uri(uri)
    exp = mlflow.set_experiment(experiment)
    client = mlflow.MlflowClient()
    parent = client.create_run(exp.experiment_id, run_name=f"sweep-{len(base_specs)}x{len(epsilons)}x{len(seeds)}")
    client.log_batch(parent.info.run_id, params=[
        Param("sweep.specs", ",".join(s.name for s in base_specs)), Param("sweep.epsilons", ",".join(map(str, epsilons))),
        Param("sweep.seeds", ",".join(map(str, seeds)))])
    cells = []
    logger = get_run_logger()
    try:
        for base in base_specs:
            for eps in epsilons if base.privacy is not None else [math.inf]:
                for seed in seeds:
                    data = base.model_dump(mode="json")
                    data["seed"] = seed
                    if base.privacy is not None:
                        data["privacy"]["epsilon"] = eps
                    cell = run_cell(specs.spec_from_dict(data), parent.info.run_id, exp.experiment_id)
                    logger.info("%s eps=%s seed=%d: accuracy %.4f", cell["name"], eps, seed, cell["accuracy"])
                    cells.append(cell)
        table = results_table(cells, epsilons)
        csv = results_csv(cells)
        log_text_artifacts(client, parent.info.run_id, {"results.md": table, "results.csv": csv})
        png = utility_plot(cells, epsilons)
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp, "privacy_utility.png")
            p.write_bytes(png)
            client.log_artifact(parent.info.run_id, str(p), artifact_path="plots")
        if output:  # after the MLflow copies: a local write that fails loses nothing
            Path(output).parent.mkdir(parents=True, exist_ok=True)
            Path(output).with_suffix(".png").write_bytes(png)
            Path(output).write_text(table)
            Path(output).with_suffix(".csv").write_text(csv)
    except BaseException:
        client.set_terminated(parent.info.run_id, "FAILED")
        raise
    client.set_terminated(parent.info.run_id, "FINISHED")
    return {"parent_run_id": parent.info.run_id, "cells": cells, "table": table}
