"""``privzo reproduce nonsmooth``: the rate experiments of the two nonsmooth papers (Zhang et al.; Kornowski et al.) (E1 to E5),
``privzo reproduce kl``: the KL paper's (E6 to E9), and ``privzo reproduce dpzero``: DPZero's Figure 1, written to
docs/ and logged to MLflow as a parent run with a child run per point.

The sweeps run the vectorised kernel (reproduce/kernel.py) on specs resolved by privzo's planner.
While they run, a second process runs privzo's own loop at the first point of every series and the kernel
on the same random inputs; the evidence stands only if every trajectory agrees to 1e-9, and the command
fails (its parent run FAILED, after everything is logged) when one does not.
"""
from __future__ import annotations

import io
import math
import multiprocessing
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import mlflow
import numpy as np
from mlflow.entities import Metric, Param
from prefect import flow, get_run_logger

from reproduce import experiments as ex
from flows.record.tracking import log_text_artifacts
from flows.record.tracking_names import PRIVZO_KIND, MLFLOW_PARENT_RUN_ID

TOLERANCE = 0.15  # the study's pass band on a slope


def _fmt(v: float, digits: int = 4) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}g}"


def slope_rows(points: List[ex.PointResult]) -> List[Dict[str, Any]]:
    """Per series: the least-squares log-log slope of the median certificate and of the bound on the same
    points, over every point and over the points whose median is below 0.9 (Gamma-bar <= 1 always: a
    median at 1 is the trivial certificate, where no rate can show). A log needs a positive median: an
    excess over the twin (E4) that is not positive at some point is left out of both fits."""
    rows = []
    for series in dict.fromkeys(p.series for p in points):
        own = [p for p in points if p.series == series and p.median > 0]
        for subset, members in (("all", own), ("below 0.9", [p for p in own if p.median < 0.9])):
            if len(members) < 2:
                rows.append({"series": series, "points": subset, "count": len(members)})
                continue
            mx = [p.x for p in members]
            measured = ex.least_squares_slope(mx, [p.median for p in members])
            bound = ex.least_squares_slope(mx, [p.predicted for p in members])
            rows.append({"series": series, "points": subset, "count": len(members), "measured": measured,
                         "bound": bound, "difference": measured - bound,
                         "within": abs(measured - bound) <= TOLERANCE,
                         "local_measured": ex.local_slopes(mx, [p.median for p in members]),
                         "local_bound": ex.local_slopes(mx, [p.predicted for p in members]), "xs": mx})
    return rows


def markdown(points: List[ex.PointResult], slopes: List[Dict[str, Any]], matches: List[ex.Match],
             seeds: Sequence[int], seconds: float, command: str) -> str:
    lines = ["# Rates of the two nonsmooth papers (Zhang et al.; Kornowski et al.), measured", "",
             f"Written by `{command}` in {seconds:.0f} s. Seeds {', '.join(map(str, seeds))} (fresh rows and "
             "noise per seed). Metric: Γ̄, the mean over windows of |mean of ∇F_r over the window's query points| "
             "(exact on P1): the expected Goldstein certificate at 2r of the output. Bound: the theorem's, "
             "constants 1, with its log factors, at each point's resolved settings. E4 (002's multi-pass ERM) "
             "measures Γ̄ on the rows' empirical objective h + ⟨ξ̄, x⟩ of its private run minus that of its "
             "non-private twin (the same schedule without noise or clips, on the same rows), against the "
             "bound's privacy term at the fixed schedule.", "",
             "## The kernel is privzo's code", "",
             "privzo's own loop (builders.build_loop: estimator, release door, mechanism, sampler, O2NC) against "
             "the kernel at the first point of each series, same public seed, injected noise generator:", "",
             "| series | point | steps | max |Δ query point| | max |Δ Γ_k| | max |Δ output| | ≤ 1e-9 | privzo s | kernel s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for m in matches:
        lines.append(f"| {m.series} | {m.x} | {m.steps} | {m.query_points:.2e} | {m.certificates:.2e} | "
                     f"{m.output:.2e} | {'yes' if m.ok else '**NO**'} | {m.privzo_seconds:.1f} | {m.kernel_seconds:.1f} |")
    for experiment in dict.fromkeys(p.series.experiment for p in points):
        own = [p for p in points if p.series.experiment == experiment]
        axis = own[0].series.axis
        lines += ["", f"## {experiment}", "",
                  "| series | n | d | steps | window | period | z | seeds | median Γ̄ | p90 Γ̄ | bound | F(out) median | s |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for p in own:
            lines.append(f"| {p.series.label} | {p.n} | {p.d} | {p.steps} | {p.settings['window']} | "
                         f"{p.settings['period']} | {_fmt(p.settings['noise_multiplier'])} | {len(p.certificates)} | "
                         f"{p.median:.4f} | {p.p90:.4f} | {_fmt(p.predicted)} | {float(np.median(p.values)):.4f} | "
                         f"{p.seconds:.0f} |")
        lines += ["", f"Slopes of log Γ̄ against log {axis} (least squares on medians; the bound's on the same points):", "",
                  "| series | points | measured | bound | difference | within ±0.15 | local measured | local bound |",
                  "|---|---|---|---|---|---|---|---|"]
        for row in slopes:
            if row["series"].experiment != experiment:
                continue
            if "measured" not in row:
                lines.append(f"| {row['series'].label} | {row['points']} ({row['count']}) | – | – | – | too few points | | |")
                continue
            lines.append(f"| {row['series'].label} | {row['points']} ({row['count']}) | {row['measured']:+.3f} | "
                         f"{row['bound']:+.3f} | {row['difference']:+.3f} | {'yes' if row['within'] else 'no'} | "
                         f"{', '.join(f'{s:+.2f}' for s in row['local_measured'])} | "
                         f"{', '.join(f'{s:+.2f}' for s in row['local_bound'])} |")
    return "\n".join(lines) + "\n"


def csv_text(points: List[ex.PointResult]) -> str:
    out = ["experiment,series,n,d,seed_index,certificate,value,bound,steps"]
    for p in points:
        for i, (c, v) in enumerate(zip(p.certificates, p.values)):
            out.append(f"{p.series.experiment},{p.series.label},{p.n},{p.d},{i},{c:.10g},{v:.10g},{p.predicted:.10g},{p.steps}")
    return "\n".join(out) + "\n"


def plot(points: List[ex.PointResult], experiment: str, ylabel: Optional[str] = None, metric: str = "Γ̄") -> bytes:
    """Medians with their seed range, and each bound scaled by one fitted constant (geometric mean of
    median/bound), its local slopes written beside its segments (a series without a bound: its medians)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    own = [p for p in points if p.series.experiment == experiment]
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for i, series in enumerate(dict.fromkeys(p.series for p in own)):
        ps = [p for p in own if p.series == series]
        xs = np.array([p.x for p in ps], float)
        med = np.array([p.median for p in ps])
        lo = np.array([min(p.certificates) for p in ps])
        hi = np.array([max(p.certificates) for p in ps])
        bound = np.array([p.predicted for p in ps])
        colour = f"C{i}"
        ax.plot(xs, med, "o-", color=colour, label=f"{series.label}: median {metric}")
        ax.fill_between(xs, lo, hi, color=colour, alpha=0.15)
        positive = (med > 0) & np.isfinite(bound)
        if not positive.any():
            continue
        scale = float(np.exp(np.mean(np.log(med[positive] / bound[positive]))))
        ax.plot(xs, scale * bound, "--", color=colour, alpha=0.8, label=f"bound × {scale:.2g}")
        for j, s in enumerate(ex.local_slopes(xs, bound)):
            xm = math.sqrt(xs[j] * xs[j + 1])
            ax.annotate(f"{s:+.2f}", (xm, scale * math.sqrt(bound[j] * bound[j + 1])), fontsize=7, color=colour,
                        textcoords="offset points", xytext=(0, 6), ha="center")
    ax.set_xscale("log")
    if all(min(p.certificates) > 0 for p in own):
        ax.set_yscale("log")
    else:  # an excess over the twin can be negative at a point
        ax.set_yscale("symlog", linthresh=1e-2)
    ax.set_xlabel("n (private rows)" if own[0].series.axis == "n" else "d (dimension)")
    ax.set_ylabel(ylabel or ("Γ̄ (expected Goldstein certificate at 2r)" if own[0].series.metric == "population"
                             else "Γ̄ on the empirical objective: private − twin"))
    ax.set_title(f"{experiment}: medians (seed range shaded); dashed: bound × fitted constant, its local slopes",
                 fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _parent_run(suite: str, experiments, seeds, quick: bool, tracking_uri: Optional[str], experiment: str):
    """The reproduction's MLflow parent run, its settings as params."""
    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    exp = mlflow.set_experiment(experiment)
    client = mlflow.MlflowClient()
    parent = client.create_run(exp.experiment_id, run_name=f"reproduce-{suite}-{'-'.join(experiments)}",
                               tags={PRIVZO_KIND: "reproduction"})
    client.log_batch(parent.info.run_id, params=[Param("reproduce.experiments", ",".join(experiments)),
                                                 Param("reproduce.seeds", ",".join(map(str, seeds))),
                                                 Param("reproduce.quick", str(quick).lower())])
    return client, exp, parent


def _publish(client, run_id: str, stem: str, text: str, csv: str, plots: Dict[str, bytes], seconds: float, matches,
             output: Optional[str]) -> None:
    """The table, CSV and plots to the parent run (then to ``output`` and beside it), and the verdict: a
    kernel that left privzo's trajectory anywhere makes the sweep no evidence about privzo."""
    log_text_artifacts(client, run_id, {f"{stem}.md": text, f"{stem}.csv": csv})
    with tempfile.TemporaryDirectory() as tmp:
        for name, png in plots.items():
            Path(tmp, name).write_bytes(png)
            client.log_artifact(run_id, str(Path(tmp, name)), artifact_path="plots")
    client.log_batch(run_id, metrics=[Metric("reproduce/seconds", seconds, 0, 0)] + [
        Metric(f"reproduce/match_{i}_max_difference", m.difference, 0, 0) for i, m in enumerate(matches)])
    if output:  # after the MLflow copies: a local write that fails loses nothing
        out = Path(output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        out.with_suffix(".csv").write_text(csv)
        for name, png in plots.items():
            (out.parent / f"{out.stem}_{name}").write_bytes(png)
    bad = [m for m in matches if not m.ok]
    if bad:
        raise RuntimeError(f"reproduce: the kernel left privzo's trajectory on {bad[0].series} at {bad[0].x} "
                           f"(max difference {bad[0].difference:.3g} > 1e-9); the sweep is not evidence about privzo")


def _match_all(pairs) -> List[ex.Match]:
    return [ex.match(series, x) for series, x in pairs]


def _sweep(series, seeds, client, experiment_id: str, parent_id: str, logger) -> List[ex.PointResult]:
    """Every point of every series through the kernel, each logged as a child run of the parent."""
    points = []
    for s in series:
        for x in s.grid:
            p = ex.run_point(s, x, s.seeds(seeds))
            logger.info("%s %s %s=%d: median %.4f (bound %.4g), %d steps, %.0f s", s.experiment, s.label,
                        s.axis, x, p.median, p.predicted, p.steps, p.seconds)
            points.append(p)
            child = client.create_run(experiment_id, run_name=f"{s.experiment}-{s.label}-{s.axis}{x}",
                                      tags={MLFLOW_PARENT_RUN_ID: parent_id})
            client.log_batch(child.info.run_id,
                             params=[Param("series", s.label), Param("n", str(p.n)), Param("d", str(p.d))]
                             + [Param(k, repr(v)) for k, v in p.settings.items()],
                             metrics=[Metric("eval/goldstein_certificate_median", p.median, 0, p.steps),
                                      Metric("eval/goldstein_certificate_p90", p.p90, 0, p.steps),
                                      Metric("theory/bound", p.predicted, 0, p.steps)]
                             + ([Metric("privacy/epsilon", p.epsilon, 0, p.steps)] if math.isfinite(p.epsilon) else []))
            client.set_terminated(child.info.run_id, "FINISHED")
    return points


@flow(name="reproduce-nonsmooth", log_prints=True)
def reproduce_nonsmooth(experiments: List[str], seeds: List[int], quick: bool = False,
                        output: Optional[str] = "docs/results/nonsmooth_rates.md", tracking_uri: Optional[str] = None,
                        experiment: str = "privzo-reproduce", command: str = "privzo reproduce nonsmooth") -> Dict[str, Any]:
    started = time.perf_counter()
    series = ex.series_of(experiments, quick)  # refuses an unknown experiment before anything starts
    logger = get_run_logger()
    client, exp, parent = _parent_run("nonsmooth", experiments, seeds, quick, tracking_uri, experiment)
    try:
        # privzo's own runs go to a second process (spawned: no forked torch state) beside the sweeps
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            pending = pool.submit(_match_all, [(s, s.grid[0]) for s in series])
            points = _sweep(series, seeds, client, exp.experiment_id, parent.info.run_id, logger)
            matches = pending.result()
        slopes = slope_rows(points)
        seconds = time.perf_counter() - started
        text = markdown(points, slopes, matches, seeds, seconds, command)
        plots = {f"{e}.png": plot(points, e) for e in experiments}
        _publish(client, parent.info.run_id, "nonsmooth_rates", text, csv_text(points), plots, seconds, matches, output)
    except BaseException:
        client.set_terminated(parent.info.run_id, "FAILED")
        raise
    client.set_terminated(parent.info.run_id, "FINISHED")
    return {"parent_run_id": parent.info.run_id, "table": text, "points": points, "matches": matches,
            "seconds": seconds}


# ---------------------------------------------------------------- the KL paper (Menart et al.) (E6 to E9)
def kl_slope_rows(points) -> List[Dict[str, Any]]:
    """Per series: the least-squares log-log slope of the medians, and of the bound on the same points (a
    baseline without a bound: its medians only)."""
    rows = []
    for series in dict.fromkeys(p.series for p in points):
        own = [p for p in points if p.series == series and p.median > 0]
        if len(own) < 2:
            rows.append({"series": series, "count": len(own)})
            continue
        xs = [p.x for p in own]
        measured = ex.least_squares_slope(xs, [p.median for p in own])
        row = {"series": series, "count": len(own), "measured": measured,
               "local_measured": ex.local_slopes(xs, [p.median for p in own])}
        if all(math.isfinite(p.predicted) and p.predicted > 0 for p in own):
            bound = ex.least_squares_slope(xs, [p.predicted for p in own])
            row.update(bound=bound, difference=measured - bound, within=abs(measured - bound) <= TOLERANCE,
                       local_bound=ex.local_slopes(xs, [p.predicted for p in own]))
        rows.append(row)
    return rows


def kl_markdown(points, slopes, matches, seeds: Sequence[int], seconds: float, command: str) -> str:
    lines = ["# Rates of the KL paper (Menart et al.) (KL condition), measured, E6 to E9", "",
             f"Written by `{command}` in {seconds:.0f} s. Seeds {', '.join(map(str, seeds))} (fresh rows and noise "
             "per seed), budget rho-zCDP under replace-one (noise multiplier 1/sqrt(2 rho) of the one Gaussian each "
             "run's charge equals). Metric: the excess empirical risk F(w_out; S) − F*(S), exact (E9: |∇F(w_out; S)|). "
             "Bound: the theorem's, constants 1, with its log factors, at each point's resolved plan. DP-GD: "
             "privzo's full-batch DP-GD (first_order + gaussian + sgd), eta = 1/(2 L1), T fixed, the same rho.", "",
             "## The kernel is privzo's code", "",
             "privzo's own loop (builders.build_loop: full_gradient, the release door, the privacy filter, the "
             "optimizer) against the kernel at the first point of each series, same rows, injected noise generator:",
             "", "| series | n | releases | max |Δ iterate| | |Δ output| | ≤ 1e-9 | privzo s | kernel s |",
             "|---|---|---|---|---|---|---|---|"]
    for m in matches:
        lines.append(f"| {m.series} | {m.x} | {m.steps} | {m.iterates:.2e} | {m.output:.2e} | "
                     f"{'yes' if m.ok else '**NO**'} | {m.privzo_seconds:.1f} | {m.kernel_seconds:.2f} |")
    for experiment in dict.fromkeys(p.series.experiment for p in points):
        own = [p for p in points if p.series.experiment == experiment]
        lines += ["", f"## {experiment}", "",
                  f"| series | n | d | rho | releases (median) | seeds | median {own[0].series.metric} | p90 | bound | s |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for p in own:
            lines.append(f"| {p.series.label} | {p.x} | {p.series.dimension} | {p.series.rho:g} | {p.steps:g} | "
                         f"{len(p.values)} | {p.median:.4g} | {p.p90:.4g} | {_fmt(p.predicted)} | {p.seconds:.1f} |")
        lines += ["", "Slopes of log(metric) against log n (least squares on medians; the bound's on the same points):",
                  "", "| series | points | measured | bound | difference | within ±0.15 | local measured | local bound |",
                  "|---|---|---|---|---|---|---|---|"]
        for row in slopes:
            if row["series"].experiment != experiment:
                continue
            if "measured" not in row:
                lines.append(f"| {row['series'].label} | {row['count']} | – | – | – | too few points | | |")
                continue
            has_bound = "bound" in row
            lines.append(
                f"| {row['series'].label} | {row['count']} | {row['measured']:+.3f} | "
                + (f"{row['bound']:+.3f} | {row['difference']:+.3f} | {'yes' if row['within'] else 'no'} | "
                   if has_bound else "– | – | (no bound) | ")
                + f"{', '.join(f'{s:+.2f}' for s in row['local_measured'])} | "
                + (', '.join(f'{s:+.2f}' for s in row['local_bound']) if has_bound else "") + " |")
    return "\n".join(lines) + "\n"


def kl_csv(points) -> str:
    out = ["experiment,series,n,d,rho,seed_index,value,bound,releases"]
    for p in points:
        for i, v in enumerate(p.values):
            out.append(f"{p.series.experiment},{p.series.label},{p.x},{p.series.dimension},{p.series.rho},{i},"
                       f"{v:.10g},{p.predicted:.10g},{p.steps:g}")
    return "\n".join(out) + "\n"


def _kl_match_all(pairs):
    from reproduce import kl_kernel as kk

    return [kk.match(series, x) for series, x in pairs]


@flow(name="reproduce-kl", log_prints=True)
def reproduce_kl(experiments: List[str], seeds: List[int], quick: bool = False,
                 output: Optional[str] = "docs/results/kl_rates.md", tracking_uri: Optional[str] = None,
                 experiment: str = "privzo-reproduce", command: str = "privzo reproduce kl") -> Dict[str, Any]:
    """Menart et al. (KL)'s rate experiments: the kernel on privzo's plans, privzo's own loop against it at the first
    point of every series (the DP-GD baselines: privzo's first_order + gaussian + sgd run)."""
    from reproduce import kl_kernel as kk

    started = time.perf_counter()
    series = kk.series_of(experiments, quick)
    logger = get_run_logger()
    client, exp, parent = _parent_run("kl", experiments, seeds, quick, tracking_uri, experiment)
    try:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            pending = pool.submit(_kl_match_all, [(s, s.grid[0]) for s in series])
            points = []
            for s in series:
                for x in s.grid:
                    p = kk.run_point(s, x, s.seeds(seeds))
                    logger.info("%s %s n=%d: median %.4g (bound %.4g), %g releases, %.1f s", s.experiment, s.label,
                                x, p.median, p.predicted, p.steps, p.seconds)
                    points.append(p)
                    child = client.create_run(exp.experiment_id, run_name=f"{s.experiment}-{s.label}-n{x}",
                                              tags={MLFLOW_PARENT_RUN_ID: parent.info.run_id})
                    client.log_batch(child.info.run_id,
                                     params=[Param("series", s.label), Param("n", str(x)), Param("rho", repr(s.rho))]
                                     + [Param(k, repr(v)) for k, v in p.settings.items()],
                                     metrics=[Metric(f"eval/{s.metric.replace(' ', '_')}_median", p.median, 0, 0),
                                              Metric(f"eval/{s.metric.replace(' ', '_')}_p90", p.p90, 0, 0),
                                              Metric("privacy/epsilon", p.epsilon, 0, 0)]
                                     + ([Metric("theory/bound", p.predicted, 0, 0)] if math.isfinite(p.predicted)
                                        else []))
                    client.set_terminated(child.info.run_id, "FINISHED")
            matches = pending.result()
        slopes = kl_slope_rows(points)
        seconds = time.perf_counter() - started
        text = kl_markdown(points, slopes, matches, seeds, seconds, command)
        plots = {f"{e}.png": plot(points, e, ylabel="excess empirical risk" if e != "E9" else "|∇F(w_out; S)|",
                                  metric="excess" if e != "E9" else "|∇F|") for e in experiments}
        _publish(client, parent.info.run_id, "kl_rates", text, kl_csv(points), plots, seconds, matches, output)
    except BaseException:
        client.set_terminated(parent.info.run_id, "FAILED")
        raise
    client.set_terminated(parent.info.run_id, "FINISHED")
    return {"parent_run_id": parent.info.run_id, "table": text, "points": points, "matches": matches,
            "seconds": seconds}


# ---------------------------------------------------------------- DPZero (DPZero's Figure 1)
def _dpzero_match_all(points):
    from reproduce import dpzero_quadratic as dq

    return [dq.match(p) for p in points]


def _edge(value, values) -> str:
    """A mark for a selected hyperparameter at the end of its grid (the best may lie beyond it)."""
    return "*" if len(values) > 1 and value in (min(values), max(values)) else ""


def _selected(run, grid, method: str) -> str:
    return (f"T={run.steps}{_edge(run.steps, grid.steps[method])}, lr={run.lr:g}{_edge(run.lr, grid.lrs[method])}, "
            f"C={run.clip:g}{_edge(run.clip, grid.clips[method])}")


def dpzero_slopes(cells, split: str = "train") -> Dict[str, Dict[str, float]]:
    """Per spectrum and method: the least-squares slope of log(best gradient norm) against log d, and of the start's
    gradient norm and of r (the references)."""
    from reproduce import dpzero_quadratic as dq

    out = {}
    for spectrum in dict.fromkeys(c.spectrum for c in cells):
        own = [c for c in cells if c.spectrum == spectrum]
        if len(own) < 2:
            continue
        dims = [c.d for c in own]
        row = {m: dq.least_squares_slope(dims, [_value(c.best(m, split), split) for c in own]) for m in dq.METHODS}
        row["start"] = dq.least_squares_slope(dims, [float(np.median(c.start_norm)) for c in own])
        row["r"] = dq.least_squares_slope(dims, [c.rank for c in own])
        out[spectrum] = row
    return out


def _value(run, split: str) -> float:
    return run.train_median if split == "train" else run.test_median


def dpzero_reading(cells, slopes) -> List[str]:
    """What the numbers say against the paper's findings, each claim checked on this run's table."""
    from reproduce import dpzero_quadratic as dq

    lines = _paper_claims(cells, slopes) + ["", "In numbers:", ""]
    total = len(cells)
    for split in ("train", "test"):
        order = sum(1 for c in cells if _value(c.best("dp_gd", split), split) <= _value(c.best("dpzero", split), split)
                    <= _value(c.best("dpgd_0th", split), split))
        gd_best = sum(1 for c in cells if min(dq.METHODS, key=lambda m: _value(c.best(m, split), split)) == "dp_gd")
        zeroth_worst = sum(1 for c in cells if max(dq.METHODS, key=lambda m: _value(c.best(m, split), split)) == "dpgd_0th")
        lines.append(f"- {split.capitalize()}: DP-GD ≤ DPZero ≤ DPGD-0th in {order} of {total} cells (spectrum × d); "
                     f"DP-GD lowest in {gd_best}, DPGD-0th highest in {zeroth_worst}.")
        exceptions = [f"{c.spectrum} d={c.d}" for c in cells
                      if not _value(c.best("dp_gd", split), split) <= _value(c.best("dpzero", split), split)
                      <= _value(c.best("dpgd_0th", split), split)]
        if exceptions:
            lines.append(f"  Out of that order: {', '.join(exceptions)}.")
    for spectrum, row in slopes.items():
        own = [c for c in cells if c.spectrum == spectrum]
        first, last = own[0], own[-1]
        ratio = {m: last.best(m).train_median / first.best(m).train_median for m in dq.METHODS}
        start_ratio = float(np.median(last.start_norm) / np.median(first.start_norm))
        saturated = float(last.best("dpgd_0th").train_median / np.median(last.start_norm))
        lines.append(
            f"- {dq.SPECTRUM_LABELS[spectrum]}: from d = {first.d} to {last.d} (r {first.rank:.3g} → {last.rank:.3g}) the "
            f"best train gradient norm grows ×{ratio['dpzero']:.3g} for DPZero (log-log slope {row['dpzero']:+.2f}), "
            f"×{ratio['dpgd_0th']:.3g} for DPGD-0th ({row['dpgd_0th']:+.2f}), ×{ratio['dp_gd']:.3g} for DP-GD "
            f"({row['dp_gd']:+.2f}); the start's gradient norm |A x̄| grows ×{start_ratio:.3g} ({row['start']:+.2f}). "
            f"At d = {last.d} DPGD-0th ends at {saturated:.2f} of the start's gradient norm"
            + (" (saturated: its best run barely moves)." if saturated > 0.8 else "."))
    return lines


def _reduction(cells, reference) -> float:
    """DP-GD's best train gradient norm on the reduced grid over that on the paper's grid, at the reference's cell."""
    cell = next(c for c in cells if c.spectrum == reference.spectrum and c.d == reference.d)
    return cell.best("dp_gd").train_median / reference.best("dp_gd").train_median


def _paper_claims(cells, slopes) -> List[str]:
    """The paper's findings on Figure 1 (§5.1), each with what this run's table says."""
    from reproduce import dpzero_quadratic as dq

    lines = ["The paper's findings on Figure 1, against this run (train; a claim is checked on the table above):", ""]
    spectra = [s for s in dq.SPECTRA if any(c.spectrum == s for c in cells)]
    ordered = [(c.spectrum, c.d) for c in cells
               if c.best("dp_gd").train_median <= c.best("dpzero").train_median <= c.best("dpgd_0th").train_median]
    lines.append(f"1. *DPGD-0th worst, DP-GD best* (DPZero between): {len(ordered)} of {len(cells)} cells "
                 f"({'holds' if len(ordered) == len(cells) else 'holds in part'}).")
    if len(spectra) > 1:
        dims = sorted({c.d for c in cells})
        better, total = 0, 0
        for d in dims:
            for m in dq.METHODS:
                values = [next((c.best(m).train_median for c in cells if c.spectrum == s and c.d == d), None)
                          for s in spectra]
                if None not in values:
                    total += 1
                    better += all(a >= b for a, b in zip(values, values[1:]))
        lines.append(f"2. *Every method improves as r shrinks* (A = I, then 1/√j, then 1/j): {better} of {total} "
                     f"(method, d) pairs ({'holds' if better == total else 'holds in part'}).")
    if "identity" in slopes:
        row = slopes["identity"]
        grows = all(row[m] > 0.25 for m in dq.METHODS)
        lines.append(f"3. *With r = d every method grows with d*: slopes {', '.join(f'{dq.METHOD_LABELS[m]} {row[m]:+.2f}' for m in dq.METHODS)} "
                     f"({'holds' if grows else 'does not hold for every method'}).")
    if "inverse" in slopes:
        row = slopes["inverse"]
        own = [c for c in cells if c.spectrum == "inverse"]
        ratios = [c.best("dpzero").train_median / c.best("dp_gd").train_median for c in own]
        flat = all(abs(row[m]) < 0.15 for m in ("dpzero", "dp_gd"))
        upper = [c for c in own if c.d * 10 >= own[-1].d]  # the last decade of d
        tail = (f"; over d = {upper[0].d}–{upper[-1].d}: DPZero "
                + ", DP-GD ".join(f"{dq.least_squares_slope([c.d for c in upper], [c.best(m).train_median for c in upper]):+.2f}"
                                  for m in ("dpzero", "dp_gd")) if len(upper) > 1 and upper[0] is not own[0] else "")
        lines.append(f"4. *With r = log d DPZero and DP-GD are nearly independent of d*: slopes DPZero {row['dpzero']:+.2f}, "
                     f"DP-GD {row['dp_gd']:+.2f}, against {row['dpgd_0th']:+.2f} for DPGD-0th and {row['r']:+.2f} for r"
                     f"{tail} (" + ("holds" if flat else "does not hold, counting a slope below 0.15 as flat") + ").")
        verdict = "holds" if max(ratios) < 1.5 else "roughly" if max(ratios) < 3 else "does not hold"
        lines.append(f"5. *There DPZero matches DP-GD*: DPZero / DP-GD = {min(ratios):.2f} to {max(ratios):.2f} across d "
                     f"({verdict}).")
    last = max(c.d for c in cells)
    saturation = [(c.spectrum, c.best("dpgd_0th").train_median / float(np.median(c.start_norm)))
                  for c in cells if c.d == last]
    saturated = [s for s, v in saturation if v > 0.8]
    lines.append(f"6. *DPGD-0th saturates at large d* (its best run barely leaves x_0): at d = {last} it ends at "
                 + ", ".join(f"{v:.2f} ({s})" for s, v in saturation) + " of ‖∇F(x_0)‖ ("
                 + ("holds" if len(saturated) == len(saturation) else f"holds for {', '.join(saturated)}" if saturated
                    else "does not hold") + ", counting a ratio above 0.8 as saturated).")
    notes = []
    for m in ("dpzero", "dpgd_0th"):
        longest = sum(1 for c in cells if c.best(m).steps == max(r.steps for r in c.of(m)))
        if longest:
            notes.append(f"{dq.METHOD_LABELS[m]} in {longest} of {len(cells)}")
    if notes:
        lines += ["", f"The best run used the grid's largest T for {' and '.join(notes)} cells: there more steps might "
                  "go lower (the paper's grid ends at the same T)."]
    return lines


def dpzero_markdown(cells, matches, grid, seeds: Sequence[int], seconds: float, command: str,
                    references=()) -> str:
    from reproduce import dpzero_quadratic as dq

    steps = sorted({t for m in dq.METHODS for t in grid.steps[m]})
    lines = [
        "# DPZero's Figure 1 (§5.1), reproduced in privzo", "",
        f"Written by `{command}` in {seconds:.0f} s on this machine's 2 cores, shared (15-minute load average at "
        f"the end: {os.getloadavg()[2]:.1f}). Seeds {', '.join(map(str, seeds))} (fresh rows, directions and noise per "
        "seed; a grid point's value is its median over the seeds).", "",
        "Problem: F(x) = (1/2n) Σ (x − x_i)ᵀA(x − x_i), x_i ~ N(1, I_d), A diagonal with ‖A‖ = 1, so r = Tr(A); "
        f"n = {grid.rows} train rows and as many test rows; x_0 = 0; the metric is ‖∇F(x_T)‖ = ‖A(x_T − x̄)‖ of the "
        "last iterate, on the train rows and on the test rows (their own mean). Methods, all privzo's own code: "
        "DPZero = two_point (Algorithm 2), DPGD-0th = dpgd_0th (Algorithm 1), DP-GD = first_order, each with the "
        f"Gaussian mechanism and plain SGD, one Gaussian direction per step, λ = {dq.SMOOTHING:g}.", "",
        f"Privacy: (ε, δ) = ({dq.EPSILON:g}, {dq.DELTA:g}) for every run. Every row in every step (full batch, as "
        "Algorithms 1 and 2 are stated; no subsampling, so no amplification) under replace-one neighbours (the "
        "paper's, and the relation under which a full-batch mean may divide by n: n is public): the noise std on "
        "the clipped sum is σ·2C, σ calibrated by privzo's accountant (RDP, dp-accounting's "
        "calibrate_dp_mechanism on the run's event: T self-composed Gaussians) for each T; the paper states the "
        "budget but not its accountant or sampling for this experiment (its theory uses advanced composition, "
        "its code opacus' RDP). Selecting the best grid point is not privatised (as in the paper).", "",
        "Grid (the paper's Table 6, reduced where marked): "
        f"DPZero and DPGD-0th: T ∈ {{{', '.join(map(str, grid.steps['dpzero']))}}}, "
        f"lr ∈ {{{', '.join(f'{v:g}' for v in grid.lrs['dpzero'])}}}, "
        f"C ∈ {{{', '.join(f'{v:g}' for v in grid.clips['dpzero'])}}}; "
        f"DP-GD: T ∈ {{{', '.join(map(str, grid.steps['dp_gd']))}}}, lr ∈ {{{', '.join(f'{v:g}' for v in grid.lrs['dp_gd'])}}}, "
        f"C ∈ {{{', '.join(f'{v:g}' for v in grid.clips['dp_gd'])}}}; d ∈ {{{', '.join(map(str, grid.dims))}}}.",
        "", "## The kernel is privzo's code", "",
        "privzo's loop (PrivateLoop, LocalBackend, the estimator, GaussianMechanism, FullBatchSampler, the privacy "
        "tracker, Sgd; per-example values from forward passes at x ± λu, per-example gradients by torch.func) against "
        "the kernel on one grid point per method, same rows, privzo's directions, one injected noise generator:", "",
        "| method | spectrum | d | n | T | lr | C | rows clipped (mean) | max |Δ iterate| | |Δ output| | ≤ 1e-9 | "
        "privzo ε | privzo s | kernel s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in matches:
        p = m.point
        lines.append(f"| {dq.METHOD_LABELS[p.method]} | {p.spectrum} | {p.d} | {p.rows} | {p.steps} | {p.lr:g} | "
                     f"{p.clip:g} | {m.clipped:.0%} | {m.iterates:.2e} | {m.output:.2e} | {'yes' if m.ok else '**NO**'} | "
                     f"{m.epsilon:.6f} | {m.privzo_seconds:.1f} | {m.kernel_seconds:.2f} |")
    lines += ["", "## Noise multipliers", "",
              "σ from privzo's accountant for T full-batch releases; the noise std on the mean is 2σC/n; ε is the "
              "accountant's for the calibrated σ (never above the target):", "",
              "| T | σ | std on the mean / C | ε |", "|---|---|---|---|"]
    for t in steps:
        sigma = dq.noise_multiplier(t, grid.rows)
        lines.append(f"| {t} | {sigma:.4f} | {2 * sigma / grid.rows:.3e} | {dq.planned_epsilon(t, grid.rows):.6f} |")
    for spectrum in dict.fromkeys(c.spectrum for c in cells):
        own = [c for c in cells if c.spectrum == spectrum]
        lines += ["", f"## {dq.SPECTRUM_LABELS[spectrum]}", "",
                  "Best gradient norm over the grid (train: the figure's panels a–c; test: d–f, each selected on its "
                  "own split), and ‖∇F(x_0)‖ for reference:", "",
                  "| d | r | ‖∇F(x_0)‖ | DPZero | DPGD-0th | DP-GD | DPZero test | DPGD-0th test | DP-GD test |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for c in own:
            train = " | ".join(f"{c.best(m).train_median:.4g}" for m in dq.METHODS)
            test = " | ".join(f"{c.best(m, 'test').test_median:.4g}" for m in dq.METHODS)
            lines.append(f"| {c.d} | {c.rank:.4g} | {float(np.median(c.start_norm)):.4g} | {train} | {test} |")
        lines += ["", "Selected on train (* = at the end of its grid):", "",
                  "| d | DPZero | DPGD-0th | DP-GD |", "|---|---|---|---|"]
        for c in own:
            lines.append(f"| {c.d} | " + " | ".join(_selected(c.best(m), grid, m) for m in dq.METHODS) + " |")
    if references:
        lines += ["", "## What DP-GD's reduced grid costs", "",
                  "DP-GD on the paper's whole grid (T to 5120, all 11 step sizes) at the smallest d, against its "
                  "reduced grid's best there (train):", "",
                  "| spectrum | d | reduced grid | paper's grid | reduced / paper |", "|---|---|---|---|---|"]
        paper = dq.paper_grid(grid.rows)
        for r in references:
            cell = next(c for c in cells if c.spectrum == r.spectrum and c.d == r.d)
            lines.append(f"| {r.spectrum} | {r.d} | {cell.best('dp_gd').train_median:.4g} "
                         f"({_selected(cell.best('dp_gd'), grid, 'dp_gd')}) | {r.best('dp_gd').train_median:.4g} "
                         f"({_selected(r.best('dp_gd'), paper, 'dp_gd')}) | {_reduction(cells, r):.3f} |")
    slopes = dpzero_slopes(cells)
    if slopes:
        test_slopes = dpzero_slopes(cells, "test")
        lines += ["", "## Growth with d", "",
                  "Least-squares slope of log(best gradient norm) against log d (train / test), beside the start's "
                  "‖∇F(x_0)‖ and r:", "",
                  "| spectrum | DPZero | DPGD-0th | DP-GD | ‖∇F(x_0)‖ | r |", "|---|---|---|---|---|---|"]
        for spectrum, row in slopes.items():
            other = test_slopes[spectrum]
            lines.append(f"| {dq.SPECTRUM_LABELS[spectrum]} | " + " | ".join(
                f"{row[m]:+.2f} / {other[m]:+.2f}" for m in dq.METHODS) + f" | {row['start']:+.2f} | {row['r']:+.2f} |")
    lines += ["", "## Reading", ""] + dpzero_reading(cells, slopes)
    lines += ["", "## Where this run differs from the paper's", "",
              f"- n = {grid.rows} rows (train and test), not {dq.PAPER_ROWS:,}: the noise on the mean is 2σC/n, so "
              f"{dq.PAPER_ROWS / grid.rows:g}× the paper's at the same σ, and every method's floor is higher than in the "
              "paper's figure. "
              "DP-GD's per-example gradient norms cost n·d per run and step; the full grid at n = 10,000 does not "
              "fit minutes on 2 cores.",
              f"- DP-GD's grid keeps T ≤ {max(grid.steps['dp_gd'])} and the step sizes "
              f"{', '.join(f'{v:g}' for v in grid.lrs['dp_gd'])}{' (what that costs: above)' if references else ''}; "
              "the zeroth-order methods "
              + ("run the paper's whole Table 6 grid." if grid.steps["dpzero"] == dq.PAPER_STEPS
                 and grid.lrs["dpzero"] == dq.PAPER_LRS and grid.clips["dpzero"] == dq.PAPER_CLIPS
                 else "run the reduced grid above."),
              "- Unstated in the paper, chosen here: x_0 = 0; the last iterate (the theorems' output is a uniformly "
              "random iterate); the gradient norm itself, not squared; Gaussian directions (the paper's "
              "experiments'; its theory's are on the sphere); the accountant, sampling and neighbouring relation "
              "above; the test gradient norm at the test rows' own mean.",
              "- Where (nearly) every row is clipped, a run depends on lr·C only (the clipped sum and its noise "
              "both scale with C), so a selected C at the grid's lower end with lr below its top is not cut short "
              "by the grid.",
              "- The runs of one (d, spectrum) share rows, directions and standard normal noise draws, each run "
              "scaling them by its own std: each run has its algorithm's exact distribution, and the best-over-grid "
              "picks among correlated runs, not independent ones."]
    return "\n".join(lines) + "\n"


def dpzero_csv(cells) -> str:
    """The figure's points: per spectrum, d, method and split, the best grid point and its value per seed."""
    from reproduce import dpzero_quadratic as dq

    out = ["spectrum,d,r,method,split,value,steps,lr,clip,noise_multiplier,start_norm,values"]
    for c in cells:
        for m in dq.METHODS:
            for split in ("train", "test"):
                run = c.best(m, split)
                values = run.train if split == "train" else run.test
                out.append(f"{c.spectrum},{c.d},{c.rank:.10g},{m},{split},{_value(run, split):.10g},{run.steps},"
                           f"{run.lr:g},{run.clip:g},{run.multiplier:.10g},{float(np.median(c.start_norm)):.10g},"
                           + ";".join(f"{v:.10g}" for v in values))
    return "\n".join(out) + "\n"


def dpzero_grid_csv(cells) -> str:
    """Every grid point of every cell (medians over the seeds)."""
    out = ["spectrum,d,method,steps,lr,clip,noise_multiplier,train,test"]
    for c in cells:
        for r in c.runs:
            out.append(f"{c.spectrum},{c.d},{r.method},{r.steps},{r.lr:g},{r.clip:g},{r.multiplier:.10g},"
                       f"{r.train_median:.10g},{r.test_median:.10g}")
    return "\n".join(out) + "\n"


def dpzero_plot(cells) -> bytes:
    """Figure 1's train panels: one per spectrum, log-log, the best gradient norm of each method against d, and
    the start's gradient norm (dotted)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from reproduce import dpzero_quadratic as dq

    spectra = list(dict.fromkeys(c.spectrum for c in cells))
    fig, axes = plt.subplots(1, len(spectra), figsize=(4.6 * len(spectra), 4.0), squeeze=False)
    for ax, spectrum in zip(axes[0], spectra):
        own = [c for c in cells if c.spectrum == spectrum]
        dims = [c.d for c in own]
        for i, m in enumerate(dq.METHODS):
            ax.plot(dims, [c.best(m).train_median for c in own], "o-", color=f"C{i}", label=dq.METHOD_LABELS[m])
        ax.plot(dims, [float(np.median(c.start_norm)) for c in own], ":", color="0.5", label="‖∇F(x_0)‖ (no step)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(dims, [str(d) for d in dims])
        ax.minorticks_off()
        ax.set_xlabel("d")
        ax.set_title(dq.SPECTRUM_LABELS[spectrum], fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("best train gradient norm ‖∇F(x_T)‖")
    axes[0][0].legend(fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _log_dpzero_cell(client, experiment_id: str, parent_id: str, cell, grid) -> None:
    """A child run per method of one (spectrum, d): its best grid points and their values."""
    from reproduce import dpzero_quadratic as dq

    for m in dq.METHODS:
        train, test = cell.best(m), cell.best(m, "test")
        child = client.create_run(experiment_id, run_name=f"{cell.spectrum}-{m}-d{cell.d}",
                                  tags={MLFLOW_PARENT_RUN_ID: parent_id})
        client.log_batch(child.info.run_id,
                         params=[Param("spectrum", cell.spectrum), Param("method", m), Param("d", str(cell.d)),
                                 Param("n", str(grid.rows)), Param("effective_rank", f"{cell.rank:.6g}"),
                                 Param("steps", str(train.steps)), Param("lr", repr(train.lr)),
                                 Param("clip", repr(train.clip)), Param("noise_multiplier", repr(train.multiplier)),
                                 Param("test_steps", str(test.steps)), Param("test_lr", repr(test.lr)),
                                 Param("test_clip", repr(test.clip))],
                         metrics=[Metric("eval/train_grad_norm", train.train_median, 0, train.steps),
                                  Metric("eval/test_grad_norm", test.test_median, 0, test.steps),
                                  Metric("eval/start_grad_norm", float(np.median(cell.start_norm)), 0, 0),
                                  Metric("privacy/epsilon", dq.planned_epsilon(train.steps, grid.rows), 0, train.steps),
                                  Metric("reproduce/seconds", cell.seconds.get(m, 0.0), 0, 0)])
        client.set_terminated(child.info.run_id, "FINISHED")


@flow(name="reproduce-dpzero", log_prints=True)
def reproduce_dpzero(experiments: List[str], seeds: List[int], quick: bool = False,
                     output: Optional[str] = "docs/results/dpzero_fig1.md", tracking_uri: Optional[str] = None,
                     experiment: str = "privzo-reproduce", command: str = "privzo reproduce dpzero") -> Dict[str, Any]:
    """DPZero's Figure 1: every grid point of the three methods on each (spectrum, d) through the kernel, a child
    run per (spectrum, method, d), privzo's own loop against the kernel on one grid point per method."""
    from reproduce import dpzero_quadratic as dq

    started = time.perf_counter()
    spectra = dq.spectra_of(experiments)  # refuses an unknown spectrum before anything starts
    grid = dq.grid_of(quick)
    logger = get_run_logger()
    client, exp, parent = _parent_run("dpzero", experiments, seeds, quick, tracking_uri, experiment)
    try:
        client.log_batch(parent.info.run_id, params=[Param("reproduce.rows", str(grid.rows)),
                                                     Param("reproduce.dims", ",".join(map(str, grid.dims)))])
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            pending = pool.submit(_dpzero_match_all, dq.match_points(grid))
            cells, references = [], []
            for spectrum in spectra:
                for d in grid.dims:
                    cell = dq.run_cell(spectrum, d, seeds, grid)
                    logger.info("%s d=%d: best train gradient norm %s (%.0f s)", spectrum, d, ", ".join(
                        f"{dq.METHOD_LABELS[m]} {cell.best(m).train_median:.4g}" for m in dq.METHODS),
                        sum(cell.seconds.values()))
                    cells.append(cell)
                    _log_dpzero_cell(client, exp.experiment_id, parent.info.run_id, cell, grid)
                if not quick:  # what DP-GD's reduced grid costs: the paper's whole grid where it is cheapest
                    references.append(dq.run_cell(spectrum, grid.dims[0], seeds, dq.paper_grid(grid.rows), ["dp_gd"]))
            matches = pending.result()
        seconds = time.perf_counter() - started
        text = dpzero_markdown(cells, matches, grid, seeds, seconds, command, references)
        csv, png = dpzero_csv(cells), dpzero_plot(cells)
        log_text_artifacts(client, parent.info.run_id, {"dpzero_fig1.md": text, "dpzero_fig1.csv": csv,
                                                        "dpzero_fig1_grid.csv": dpzero_grid_csv(cells)})
        with tempfile.TemporaryDirectory() as tmp:
            Path(tmp, "dpzero_fig1.png").write_bytes(png)
            client.log_artifact(parent.info.run_id, str(Path(tmp, "dpzero_fig1.png")), artifact_path="plots")
        client.log_batch(parent.info.run_id, metrics=[Metric("reproduce/seconds", seconds, 0, 0)] + [
            Metric(f"reproduce/match_{m.point.method}_max_difference", m.difference, 0, 0) for m in matches] + [
            Metric(f"reproduce/dp_gd_reduced_over_paper_grid_{r.spectrum}", _reduction(cells, r), 0, 0)
            for r in references])
        if output:  # after the MLflow copies: a local write that fails loses nothing
            out = Path(output)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
            out.with_suffix(".csv").write_text(csv)
            out.with_suffix(".png").write_bytes(png)
        bad = [m for m in matches if not m.ok]
        if bad:
            raise RuntimeError(f"reproduce: the kernel left privzo's trajectory on {bad[0].point.method} (max "
                               f"difference {bad[0].difference:.3g} > 1e-9); the sweep is not evidence about privzo")
    except BaseException:
        client.set_terminated(parent.info.run_id, "FAILED")
        raise
    client.set_terminated(parent.info.run_id, "FINISHED")
    return {"parent_run_id": parent.info.run_id, "table": text, "cells": cells, "matches": matches,
            "seconds": seconds}
