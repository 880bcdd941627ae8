"""``sweep``: one spec per estimator x epsilons x seeds, a parent MLflow run with a child run per cell,
a results table (mean +- std over seeds) and the privacy-utility plot.

Each cell is a complete private run of its own (calibrated for its epsilon, fresh OS-entropy noise);
cells share nothing private. Selecting hyperparameters by these results is outside every cell's
guarantee, as with any tuning on the data.

A cell that is not private (privacy.insecure_deterministic, or mechanism none) is marked so in every
output: its rows in the table and the CSV (column ``private``), its series in the plot, and its child
run's epsilon metric (``privacy/nominal_epsilon_not_private``, never ``privacy/epsilon``).

Every cell is reported in its spec's own headline metrics (``METRICS``), those its evaluation returns: test
accuracy for a classifier; for a synthetic objective its excess risk (the nonsmooth problem's population
F(x) - inf F, a KL problem's excess empirical risk) plus O2NC's Goldstein window certificate or a KL
problem's gradient norm (the only metric of logistic_nonconvex, which has no closed-form minimiser). The
markdown table has one table per metric, each listing the specs that have it; the CSV one column per
metric (empty where a cell lacks it); the plot one panel per metric. A sweep of classifiers only prints
the one accuracy table as before, without a heading. So mixed sweeps (classifiers with objectives) run,
and no row ever sets an accuracy beside an excess risk.

Each child run logs, like every training run, its evaluation at step 0 (the model before any private step: a
pretrained model's zero-shot score); each metric's table has an "at step 0" column beside the final ones,
read from the child runs' metric histories, and the CSV a ``<metric>_at_step0`` column. With ``output``, the
table and the CSV are rewritten (atomically) after every finished cell, so a sweep stopped at a deadline
leaves the cells it finished, under a line saying how many of how many.
"""
from __future__ import annotations

import io
import os
import math
import statistics
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import mlflow
from mlflow.entities import Metric, Param, RunTag
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

import specs
from components import builders
from components.protocols import Finalizing
from flows.tasks import evaluation
from flows.record.registration import epsilon_metric
from flows.record.reporting import summarize
from flows.record.tracking import dp_tags, log_text_artifacts
from flows.record.tracking_names import PRIVZO_ESTIMATOR, MLFLOW_PARENT_RUN_ID


@task(name="sweep-cell", cache_policy=NO_CACHE, retries=0)
def run_cell(spec: specs.RunSpec, parent_run_id: str, experiment_id: str) -> Dict[str, Any]:
    """Train one cell to the end and log it as a child run; noise is drawn here, so never retried.

    Like every training run, the child run logs the model's evaluation before any private step at step 0
    (on the test and public rows only: a pretrained model's zero-shot score) and the trained model's at the
    last step. The cell's ``step0`` (its headline metrics at step 0) is read back from the child run's metric
    history, so the table shows what MLflow holds."""
    start = time.perf_counter()
    data = builders.load_data(spec)
    resolved, _rate, _planned = builders.plan(spec, data)
    built = builders.build_loop(resolved, data)
    warm_steps = builders.public_warm_start(resolved, built)
    privacy = resolved.privacy
    steps = resolved.optimizer.steps
    client = mlflow.MlflowClient()
    run_id = client.create_run(experiment_id, run_name=f"{resolved.name}-eps{privacy.epsilon if privacy else 'inf'}"
                               f"-s{resolved.seed}", tags={MLFLOW_PARENT_RUN_ID: parent_run_id,
                                                           PRIVZO_ESTIMATOR: resolved.estimator.kind}).info.run_id
    try:
        before = {**({"public/warm_start_steps": warm_steps} if warm_steps else {}), **evaluation(built, data)}
        client.log_batch(run_id, params=[Param(k, v) for k, v in specs.flatten(resolved).items()],
                         metrics=_metrics_at(before, 0))
        built.loop.run(steps)
        optimizer = built.loop.backend.optimizer
        if isinstance(optimizer, Finalizing):  # the output `privzo run` evaluates (O2NC's window average, a KL pick)
            optimizer.finalize()
        after = evaluation(built, data)  # with O2NC's certificate: exact, the synthetic objective reads no row for it
        seconds = time.perf_counter() - start  # loading, planning, warm start, training and both evaluations
        eps = built.loop.tracker.epsilon()
        summary = summarize(resolved, eps, built.loop.tracker.steps, built.loop.sampler,
                            built.loop.estimator.queries_per_step, rho=built.loop.tracker.rho(),
                            noise_source=built.loop.mechanism.noise_source)
        client.log_batch(run_id, metrics=_metrics_at({**after, "time/seconds": seconds, **(
            {epsilon_metric(resolved): eps} if epsilon_metric(resolved) else {})}, steps),
                         tags=[RunTag(k, v) for k, v in dp_tags(summary, data.private.fingerprint).items()])
    except BaseException:
        client.set_terminated(run_id, "FAILED")
        raise
    client.set_terminated(run_id, "FINISHED")
    test = {k.split("/", 1)[1]: v for k, v in after.items() if k.startswith("eval/")}
    shown = headline(test)
    return {"name": resolved.name, "estimator": resolved.estimator.kind, "epsilon": privacy.epsilon if privacy else math.inf,
            "seed": resolved.seed, **{m: test[m] for m in shown}, "metrics": shown,
            "step0": logged_at_step0(client, run_id, shown), "spent_epsilon": eps, "seconds": seconds,
            "private": resolved.private}


def _metrics_at(values: Dict[str, float], step: int) -> List[Metric]:
    now = int(time.time() * 1000)
    return [Metric(k, float(v), now, step) for k, v in values.items()]


def logged_at_step0(client, run_id: str, metrics: List[str]) -> Dict[str, float]:
    """The headline metrics a run logged at step 0 (``eval/<metric>``: the model before any private step),
    read from its metric history; a metric it did not log then (O2NC's certificate) is left out."""
    found = {}
    for m in metrics:
        at_start = [x.value for x in client.get_metric_history(run_id, f"eval/{m}") if x.step == 0]
        if at_start:
            found[m] = at_start[-1]  # the last one logged at step 0
    return found


NOT_PRIVATE = "NOT private"


@dataclass(frozen=True)
class HeadlineMetric:
    label: str        # in `privzo run`'s summary line and the table's heading
    axis: str         # the plot's y axis
    percent: bool     # shown x 100 (accuracy)
    lower_better: bool


# What models.evaluate (and O2NC's certificate) can return, in the order the outputs show them. A cell's
# headline is those of them it has: a spec needs no declaration, and a new problem's metric is one row here.
METRICS: Dict[str, HeadlineMetric] = {
    "accuracy": HeadlineMetric("test accuracy", "test accuracy (%)", True, False),
    # a causal LM's completions (components/models/lm.py): greedy decoding gives the completion exactly
    "exact_match": HeadlineMetric("test exact match", "test exact match (%)", True, False),
    "excess_risk": HeadlineMetric("excess risk", "excess risk", False, True),
    "goldstein_certificate": HeadlineMetric("Goldstein certificate", "Goldstein certificate", False, True),
    "grad_norm": HeadlineMetric("gradient norm", "gradient norm", False, True),
}


def headline(evaluated: Dict[str, float]) -> List[str]:
    """The headline metrics among an evaluation's (models.evaluate's keys, without ``eval/``)."""
    return [m for m in METRICS if m in evaluated]


def _metrics_of(cell: Dict[str, Any]) -> List[str]:
    return cell.get("metrics", ["accuracy"])  # cells made before metrics were named are a classifier's


def _metrics(cells: List[Dict[str, Any]]) -> List[str]:
    """Every headline metric of the sweep, in METRICS order."""
    found = {m for c in cells for m in _metrics_of(c)}
    return [m for m in METRICS if m in found]


def _shown(metric: str, values: List[float]) -> str:
    """Mean (± std over seeds) as the table shows it: accuracy in percent, an objective's metric in 4 digits."""
    if METRICS[metric].percent:
        if len(values) == 1:  # one seed: no spread to state (a "± 0.0" would claim one)
            return f"{100 * values[0]:.1f}"
        return f"{100 * statistics.mean(values):.1f} ± {100 * statistics.stdev(values):.1f}"
    if len(values) == 1:
        return f"{values[0]:.4g}"
    return f"{statistics.mean(values):.4g} ± {statistics.stdev(values):.2g}"


def _label(name: str, cells: List[Dict[str, Any]]) -> str:
    """A spec's name in the table and plot, marked where any of its cells is not private (an
    insecure_deterministic spec's epsilons are nominal)."""
    return name if all(c.get("private", True) for c in cells if c["name"] == name) else f"{name} ({NOT_PRIVATE})"


def _step0_of(cell: Dict[str, Any], metric: str) -> Optional[float]:
    """A cell's metric at step 0 (the model before any private step), or None (cells made before step 0 was
    logged, a metric not logged at step 0)."""
    return (cell.get("step0") or {}).get(metric)


def results_csv(cells: List[Dict[str, Any]]) -> str:
    """One line per cell, a column per headline metric of the sweep (empty where a cell has not that metric),
    then ``<metric>_at_step0`` for each metric logged at step 0 (the model before any private step);
    ``seconds`` is the cell's wall time (empty if not measured); ``private`` false marks a cell whose epsilon
    is nominal or none."""
    metrics = _metrics(cells)
    at_start = [m for m in metrics if any(_step0_of(c, m) is not None for c in cells)]

    def value(v: Optional[float], m: str) -> str:
        return "" if v is None else format(v, ".6f" if METRICS[m].percent else ".6g")

    columns = ["name", "estimator", "epsilon", "seed", *metrics, *(f"{m}_at_step0" for m in at_start),
               "spent_epsilon", "seconds", "private"]
    return ",".join(columns) + "\n" + "".join(",".join([
        c["name"], c["estimator"], str(c["epsilon"]), str(c["seed"]),
        *(value(c[m] if m in _metrics_of(c) else None, m) for m in metrics),
        *(value(_step0_of(c, m), m) for m in at_start),
        format(c["spent_epsilon"], ".6g"), "" if c.get("seconds") is None else format(c["seconds"], ".1f"),
        str(c.get("private", True)).lower()]) + "\n" for c in cells)


def results_table(cells: List[Dict[str, Any]], epsilons: List[float], pending: int = 0) -> str:
    """Mean (± std over seeds) of each spec at each epsilon: one table per headline metric, listing the specs
    that have it (a sweep of classifiers: the accuracy table alone, without a heading). Where the cells logged
    it, an "at step 0" column gives the model before any private step (a pretrained model's zero-shot score).
    ``pending``: cells not finished yet (a table written while the sweep runs says so under it)."""
    metrics = _metrics(cells)
    if metrics == ["accuracy"]:
        lines = _metric_table(cells, epsilons, "accuracy")
    else:
        lines = []
        for m in metrics:
            better = "lower is better" if METRICS[m].lower_better else "higher is better"
            if lines:
                lines.append("")
            lines += [f"**{METRICS[m].axis}** ({better})", ""]
            lines += _metric_table([c for c in cells if m in _metrics_of(c)], epsilons, m)
    if any(not c.get("private", True) for c in cells):
        lines.append(f"\n{NOT_PRIVATE}: no (ε, δ) guarantee holds for a row so marked; an insecure_deterministic "
                     "row's ε is nominal (its noise and batches come from the public seed).")
    if pending:
        lines.append(f"\nPartial: {len(cells)} of {len(cells) + pending} cells finished when this was written (the "
                     "sweep writes it after each cell; an interrupted sweep leaves the cells it finished).")
    return "\n".join(lines).lstrip("\n") + "\n"


def _step0_shown(cells: List[Dict[str, Any]], metric: str) -> str:
    """A spec's metric at step 0: the same model at every epsilon of a seed (its seed's initialisation and
    public warm start), so one value per seed (the mean over its epsilons), shown as mean (± std over seeds)."""
    by_seed = defaultdict(list)
    for c in cells:
        if _step0_of(c, metric) is not None:
            by_seed[c["seed"]].append(_step0_of(c, metric))
    return _shown(metric, [statistics.mean(v) for v in by_seed.values()]) if by_seed else "–"


def _metric_table(cells: List[Dict[str, Any]], epsilons: List[float], metric: str) -> List[str]:
    by = defaultdict(list)
    for c in cells:
        by[(c["name"], c["epsilon"])].append(c[metric])
    names = list(dict.fromkeys(c["name"] for c in cells))
    # a mechanism none spec runs once per seed at epsilon inf: its own column, not a row of dashes
    columns = list(epsilons) + ([math.inf] if any(c["epsilon"] == math.inf for c in cells) else [])
    at_start = any(_step0_of(c, metric) is not None for c in cells)  # not in tables of cells made before
    head = "| spec | " + ("at step 0 | " if at_start else "") + \
        " | ".join(f"ε = {e:g}" if math.isfinite(e) else "no DP" for e in columns) + " | s / run |"
    lines = [head, "|---|" + "---|" * (len(columns) + 1 + at_start)]
    for name in names:
        row = [_step0_shown([c for c in cells if c["name"] == name], metric)] if at_start else []
        for e in columns:
            values = by.get((name, e), [])
            row.append(_shown(metric, values) if values else "–")
        times = [c["seconds"] for c in cells if c["name"] == name and c.get("seconds") is not None]
        row.append(f"{statistics.mean(times):.0f}" if times else "–")  # wall time of one cell, mean over cells
        lines.append(f"| {_label(name, cells)} | " + " | ".join(row) + " |")
    return lines


def utility_plot(cells: List[Dict[str, Any]], epsilons: List[float]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = _metrics(cells)
    fig, axes = plt.subplots(1, len(metrics), figsize=(6 * len(metrics), 4), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        scale = 100 if METRICS[metric].percent else 1
        having = [c for c in cells if metric in _metrics_of(c)]
        for name in dict.fromkeys(c["name"] for c in having):
            means = [statistics.mean([c[metric] for c in having if c["name"] == name and c["epsilon"] == e]
                                     or [math.nan]) for e in epsilons]
            private = _label(name, cells) == name
            unbounded = [c[metric] for c in having if c["name"] == name and c["epsilon"] == math.inf]
            if unbounded:  # mechanism none: no epsilon to place it at
                ax.axhline(scale * statistics.mean(unbounded), linestyle="--", color="grey", label=_label(name, cells))
                continue
            ax.plot(epsilons, [scale * m for m in means], marker="o", label=_label(name, cells),
                    linestyle="-" if private else ":")
        ax.set_xscale("log")
        values = [c[metric] for c in having if math.isfinite(c[metric])]
        if not METRICS[metric].percent and values:
            if min(values) > 0 and max(values) >= 10 * min(values):
                ax.set_yscale("log")  # an excess risk spanning orders of magnitude across epsilons and specs
            else:  # from 0: a near-constant metric (a certificate at 1) must not be stretched into a slope
                ax.set_ylim(bottom=min(0.0, min(values)), top=1.1 * max(values) if max(values) > 0 else None)
        ax.set_xlabel("ε (δ as each spec resolves it)")
        ax.set_ylabel(METRICS[metric].axis)
        ax.set_title("privacy–utility" if len(metrics) == 1 else f"privacy–utility: {METRICS[metric].label}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    if len(metrics) > 1:
        fig.tight_layout()  # the panels' axis labels apart
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


def _logged(metric: str, value: float) -> str:
    return format(value, ".4f" if METRICS[metric].percent else ".4g")


def write_atomically(path: Path, content) -> None:
    """``content`` (text or bytes) at ``path``, whole or not at all: written beside it, then renamed over it,
    so a reader (or a sweep killed mid-write) never finds half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(content.encode("utf-8") if isinstance(content, str) else content)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_outputs(output: str, cells: List[Dict[str, Any]], epsilons: List[float], total: int) -> None:
    """The markdown table at ``output`` and the CSV beside it, for the cells finished so far (of ``total``)."""
    write_atomically(Path(output), results_table(cells, epsilons, pending=total - len(cells)))
    write_atomically(Path(output).with_suffix(".csv"), results_csv(cells))


def _write_so_far(output: str, cells: List[Dict[str, Any]], epsilons: List[float], total: int, logger) -> None:
    """The outputs while the sweep runs; a write that fails is a warning, not the end of the sweep (MLflow holds
    every cell, and the final write, after MLflow's copies, raises as before). The plot is written at the end
    only: an earlier sweep's is removed, so it never stands beside this sweep's cells."""
    try:
        write_outputs(output, cells, epsilons, total)
        Path(output).with_suffix(".png").unlink(missing_ok=True)
    except OSError as err:
        logger.warning("--out: cannot write %s after %d of %d cells (%s); the sweep goes on", output, len(cells),
                       total, err.strerror or err)


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
    cells: List[Dict[str, Any]] = []
    total = sum((len(epsilons) if base.privacy is not None else 1) * len(seeds) for base in base_specs)
    logger = get_run_logger()
    try:
        if output:  # nothing of an earlier sweep's may stand beside this one's cells
            _write_so_far(output, cells, epsilons, total, logger)
        for base in base_specs:
            for eps in epsilons if base.privacy is not None else [math.inf]:
                for seed in seeds:
                    data = base.model_dump(mode="json")
                    data["seed"] = seed
                    if base.privacy is not None:
                        data["privacy"]["epsilon"] = eps
                    cell = run_cell(specs.spec_from_dict(data), parent.info.run_id, exp.experiment_id)
                    logger.info("%s eps=%s seed=%d: %s", cell["name"], eps, seed, ", ".join(
                        f"{m} {_logged(m, cell[m])}" + (f" (step 0: {_logged(m, cell['step0'][m])})"
                                                        if m in cell["step0"] else "") for m in cell["metrics"]))
                    cells.append(cell)
                    if output:  # after every cell: a sweep stopped at a deadline leaves the cells it finished
                        _write_so_far(output, cells, epsilons, total, logger)
        table = results_table(cells, epsilons)
        csv = results_csv(cells)
        log_text_artifacts(client, parent.info.run_id, {"results.md": table, "results.csv": csv})
        png = utility_plot(cells, epsilons)
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp, "privacy_utility.png")
            p.write_bytes(png)
            client.log_artifact(parent.info.run_id, str(p), artifact_path="plots")
        if output:  # after the MLflow copies: a local write that fails loses nothing
            write_atomically(Path(output).with_suffix(".png"), png)
            write_outputs(output, cells, epsilons, total)
    except BaseException:
        client.set_terminated(parent.info.run_id, "FAILED")
        raise
    client.set_terminated(parent.info.run_id, "FINISHED")
    return {"parent_run_id": parent.info.run_id, "cells": cells, "table": table}
