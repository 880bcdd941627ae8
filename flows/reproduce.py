"""``privzo reproduce nonsmooth``: the rate experiments of papers 001 and 002 (build study §6.2: E1 to E5), and
``privzo reproduce kl``: paper 003's (E6 to E9), written to docs/ and logged to MLflow as a parent run with a
child run per point.

The sweeps run the vectorised kernel (components/reproduce/kernel.py) on specs resolved by privzo's planner.
While they run, a second process runs privzo's own loop at the first point of every series and the kernel
on the same random inputs; the evidence stands only if every trajectory agrees to 1e-9, and the command
fails (its parent run FAILED, after everything is logged) when one does not.
"""
from __future__ import annotations

import io
import math
import multiprocessing
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import mlflow
import numpy as np
from mlflow.entities import Metric, Param
from prefect import flow, get_run_logger

from components.reproduce import experiments as ex
from flows.tracking import log_text_artifacts

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
    lines = ["# Rates of papers 001 and 002, measured (build study §6.2)", "",
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
                  f"| series | n | d | steps | window | period | z | seeds | median Γ̄ | p90 Γ̄ | bound | F(out) median | s |",
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
                               tags={"privzo.kind": "reproduction"})
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
                                      tags={"mlflow.parentRunId": parent_id})
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


# ---------------------------------------------------------------- paper 003 (E6 to E9)
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
    lines = ["# Rates of paper 003 (KL condition), measured (build study §6.2, E6 to E9)", "",
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
    from components.reproduce import kl_kernel as kk

    return [kk.match(series, x) for series, x in pairs]


@flow(name="reproduce-kl", log_prints=True)
def reproduce_kl(experiments: List[str], seeds: List[int], quick: bool = False,
                 output: Optional[str] = "docs/results/kl_rates.md", tracking_uri: Optional[str] = None,
                 experiment: str = "privzo-reproduce", command: str = "privzo reproduce kl") -> Dict[str, Any]:
    """Paper 003's rate experiments: the kernel on privzo's plans, privzo's own loop against it at the first
    point of every series (the DP-GD baselines: privzo's first_order + gaussian + sgd run)."""
    from components.reproduce import kl_kernel as kk

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
                                              tags={"mlflow.parentRunId": parent.info.run_id})
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
