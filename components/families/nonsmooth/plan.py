"""Planning the private nonsmooth runs (O2NC with zo_spider, fo_spider or zo_naive): the theory preset's settings,
the node sensitivity the door checks every release against, the calibrated noise and the learning rate.

Everything here reads public values only: n (public under replace-one; a Poisson multi-pass run, under
add/remove, plans from its declared row count), the model's dimension, the spec's assumptions and the
privacy target. The noise is calibrated by dp-accounting on the run's own event (the tree's J node releases,
002's multi-pass restarts and differences, or 001's baseline's one Gaussian per row), never taken from the
papers' conversions.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import dp_accounting

import components.families.nonsmooth.presets as presets
from components.data.sampling import SinglePassSampler
from components.families.common import accountant, spec_sampler
from components.mechanisms.scheduled import scheduled_event
from components.mechanisms.tree import tree_event
from components.families.nonsmooth.presets import Schedule
from specs.traits import MULTI_PASS_SAMPLERS as MULTI_PASS_SAMPLING, RUNNING_SUM_ESTIMATORS as SPIDER_KINDS


def assumptions_of(spec) -> Tuple[float, float]:
    """(L, Phi): the spec's assumptions, or a synthetic problem's own exact ones."""
    source = spec.data.source
    given = spec.assumptions
    lipschitz = None if given is None or given.lipschitz == "auto" else float(given.lipschitz)
    gap = None if given is None or given.initial_gap == "auto" else float(given.initial_gap)
    if source.kind == "synthetic":
        lipschitz = source.lipschitz if lipschitz is None else lipschitz
        gap = source.initial_gap if gap is None else gap
    if lipschitz is None or gap is None:
        raise ValueError("assumptions: preset theory needs lipschitz and initial_gap")
    return lipschitz, gap


def multi_pass(spec) -> bool:
    """Kornowski, Liu and Talwar's multi-pass algorithm: a spider oracle over full batches, or over Poisson batches (its
    footnote 2)."""
    return spec.estimator.kind in SPIDER_KINDS and spec.sampling.kind in MULTI_PASS_SAMPLING


def neighbour_factor(spec) -> float:
    """How many per-example bounds one neighbouring dataset moves a batch sum by: 2 replace-one, 1 add/remove."""
    return 2.0 if spec.privacy.neighboring == "replace_one" else 1.0


def scheduled_sensitivities(spec, n_private: Optional[int]) -> Tuple[float, float]:
    """(Delta_1, Delta_2) of a resolved scheduled_gaussian spec: the most one row moves a restart's and a
    difference's release, its clip over the batch normaliser (n rows of a full batch, the expected b of a
    Poisson batch), twice that under replace-one."""
    mech = spec.mechanism
    factor = neighbour_factor(spec)
    rows = spec.batch_size(n_private)
    return factor * float(mech.clip) / rows, factor * float(mech.difference_clip) / rows


def coupled_directions(spec) -> bool:
    """zo_spider variant improved with ``coupling: coupled``: a difference's two points share their directions (the
    deviation from the paper); the paper's are independent."""
    return spec.estimator.kind == "zo_spider" and spec.estimator.coupling == "coupled"


def spider_period(spec) -> int:
    """Steps between restarts of a spider oracle's running sum: the tree's period, or the multi-pass Sigma."""
    return spec.estimator.period if multi_pass(spec) else spec.sampling.period


def theory_preset(spec, n: int, d: int, epsilon: float, mu: float, delta: Optional[float]) -> Schedule:
    est = spec.estimator
    lipschitz, gap = assumptions_of(spec)
    if multi_pass(spec):
        if delta is None or not math.isfinite(epsilon):
            raise ValueError("optimizer.preset: theory of Kornowski et al.'s multi-pass algorithm sets its directions from "
                             "the privacy noise; a run without privacy gives its settings (preset: manual)")
        given = spec.assumptions.concentration_delta if spec.assumptions is not None else None
        return presets.preset_002_multi_pass(n, d, lipschitz, gap, est.radius, spec.optimizer.target_stationarity,
                                             epsilon, delta, given or delta / 2, first_order=est.kind == "fo_spider",
                                             batch=spec.batch_size(n), coupled=coupled_directions(spec),
                                             constants=spec.optimizer.constants)
    if est.kind == "zo_naive":
        return presets.preset_001_naive(n, d, lipschitz, gap, est.radius, mu)
    if est.variant == "original":
        return presets.preset_001(n, d, lipschitz, gap, est.radius, mu)
    given = spec.assumptions.concentration_delta if spec.assumptions is not None else None
    delta0 = given or (delta / 2 if delta is not None else 1e-6)
    return presets.preset_002(n, d, lipschitz, gap, est.radius, epsilon, delta0, first_order=est.kind == "fo_spider",
                              coupled=coupled_directions(spec), constants=spec.optimizer.constants)


def _manual(spec, d: int, n: int) -> Schedule:
    """The spec's own settings as a Schedule (preset manual: nothing is auto)."""
    est, opt, sampling, mech = spec.estimator, spec.optimizer, spec.sampling, spec.mechanism
    naive = est.kind == "zo_naive"
    clip = getattr(mech, "clip", math.inf)
    if multi_pass(spec):
        rows = spec.batch_size(n)  # n, or a Poisson batch's expected size
        ratio = 1.0
        if mech.kind == "scheduled_gaussian":  # the stds' ratio: multipliers times the clips they scale
            ratio = mech.difference_noise_multiplier * mech.difference_clip / (mech.noise_multiplier * mech.clip)
        return Schedule(est.variant, steps=opt.steps, window=opt.window, period=est.period, start_batch=rows,
                        step_batch=rows, step_bound=opt.step_bound, start_directions=est.start_directions,
                        directions=est.directions, clip_mode="vector", start_clip=clip,
                        difference_clip=getattr(mech, "difference_clip", math.inf), restart=opt.restart,
                        radius=est.radius, rows_used=n, predicted=math.nan, difference_noise_ratio=ratio,
                        multi_pass=True, coupled=coupled_directions(spec))
    return Schedule("original_naive" if naive else est.variant, steps=opt.steps, window=opt.window,
                    period=1 if naive else sampling.period, start_batch=sampling.start_batch,
                    step_batch=sampling.step_batch, step_bound=opt.step_bound,
                    start_directions=est.directions if naive else est.start_directions, directions=est.directions,
                    clip_mode="scalar" if naive or est.variant == "original" else "vector", start_clip=clip,
                    difference_clip=clip if naive else getattr(mech, "difference_clip", math.inf),
                    restart=opt.restart, radius=est.radius, rows_used=0, predicted=math.nan,
                    coupled=coupled_directions(spec))


def node_sensitivity(spec, d: int) -> float:
    """Delta_max of a resolved tree spec: twice (replace-one) the most one row moves an increment."""
    est, mech, sampling = spec.estimator, spec.mechanism, spec.sampling
    scale = math.sqrt(d) if est.variant == "original" else 1.0
    start = mech.clip * scale / sampling.start_batch
    difference = mech.difference_clip * scale / sampling.step_batch
    if est.variant == "original":  # the coefficient clip follows the move, at most 2D
        difference *= 2 * spec.optimizer.step_bound / est.radius
    return 2.0 * max(start, difference)


def _filled(spec, schedule: Schedule) -> Dict[str, Dict[str, Any]]:
    """The preset's values for every field the spec left auto."""
    est, opt, sampling, mech = spec.estimator, spec.optimizer, spec.sampling, spec.mechanism
    out: Dict[str, Dict[str, Any]] = {"optimizer": {}, "sampling": {}, "estimator": {}, "mechanism": {}}

    def fill(section, obj, field, value):
        if getattr(obj, field, None) == "auto":
            out[section][field] = value

    fill("optimizer", opt, "step_bound", schedule.step_bound)
    fill("optimizer", opt, "window", schedule.window)
    fill("optimizer", opt, "restart", schedule.restart)
    fill("optimizer", opt, "steps", schedule.steps)
    if multi_pass(spec) and est.period in ("auto", None):  # None: the spec left it out
        out["estimator"]["period"] = schedule.period
    else:
        fill("sampling", sampling, "start_batch", schedule.start_batch)
        fill("sampling", sampling, "period", schedule.period)
    if est.kind == "zo_spider":
        fill("estimator", est, "start_directions", schedule.start_directions)
        fill("estimator", est, "directions", schedule.directions)
    if est.kind == "fo_spider":
        fill("estimator", est, "start_perturbations", schedule.start_directions)
        fill("estimator", est, "perturbations", schedule.directions)
    fill("mechanism", mech, "clip", schedule.start_clip)
    fill("mechanism", mech, "difference_clip", schedule.difference_clip)
    return out


def resolve_o2nc(spec, n_private: Optional[int], dimension: Optional[int]):
    """(resolved spec, sampling rate, planned epsilon) of an O2NC run; refuses in one line a spec whose
    rows cannot carry its schedule or reach its target. The rate is 1 but for a Poisson multi-pass run."""
    source = spec.data.source
    d = dimension if dimension is not None else (source.dimension if source.kind == "synthetic" else None)
    if d is None:
        raise ValueError("optimizer.kind: o2nc needs the model's dimension to plan (pass the data)")
    n = spec.public_rows(n_private)
    private = spec.mechanism.kind != "none"
    delta = spec.delta_for(n_private) if spec.privacy is not None else None
    epsilon = float(spec.privacy.epsilon) if spec.privacy is not None else math.inf
    mu = presets.gdp_mu(epsilon, delta) if private else math.inf
    opt = spec.optimizer
    schedule = theory_preset(spec, n, d, epsilon, mu, delta) if opt.preset != "manual" else None
    if (schedule is not None and opt.target_stationarity is not None and not multi_pass(spec)
            and schedule.predicted > opt.target_stationarity):
        need = presets.rows_for_target(lambda rows: theory_preset(spec, rows, d, epsilon, mu, delta).predicted
                                       if _fits(spec, rows, d, epsilon, mu, delta) else math.inf,
                                       opt.target_stationarity, n)
        raise ValueError(f"optimizer.target_stationarity: {opt.target_stationarity:g} needs about {need} private rows "
                         f"by the theorem; {n} reach {schedule.predicted:.3g}")
    if schedule is not None and multi_pass(spec) and private:
        lipschitz, gap = assumptions_of(spec)
        need = presets.multi_pass_rows_needed(d, lipschitz, gap, spec.estimator.radius, opt.target_stationarity,
                                              epsilon)
        if n < need:
            raise ValueError(f"optimizer.target_stationarity: {opt.target_stationarity:g} needs about {need} private "
                             f"rows by Theorem 4.1; {n} are too few (or raise the target)")
    filled = _filled(spec, schedule) if schedule is not None else {}
    scheduled = spec.mechanism.kind == "scheduled_gaussian"
    if scheduled and spec.mechanism.difference_noise_multiplier == "auto":
        # z_2 / z_1 from the paper's ratio of stds; planned at z_1 = 1 below, then scaled with the calibrated z_1
        clips = (filled["mechanism"].get("clip", spec.mechanism.clip),
                 filled["mechanism"].get("difference_clip", spec.mechanism.difference_clip))
        from components.mechanisms.scheduled import noise_ratio

        filled["mechanism"]["difference_noise_multiplier"] = noise_ratio(*clips, schedule.difference_noise_ratio)
    # every setting but the noise and eta, which are derived from the others next
    placeholder = {**filled, "optimizer": {**filled.get("optimizer", {}), **({"lr": 1.0} if opt.lr == "auto" else {})}}
    partial = spec.resolved(n_private=n_private, noise_multiplier=1.0 if private else None, filled=placeholder)
    sampler = spec_sampler(partial, n)
    need_rows = sampler.rows_for(partial.optimizer.steps) if isinstance(sampler, SinglePassSampler) else n
    if need_rows > n:
        raise ValueError(f"optimizer.steps: {partial.optimizer.steps} steps of this schedule read {need_rows} rows, "
                         f"more than the {n} private rows (each is read once)")
    if partial.optimizer.window > partial.optimizer.steps:
        raise ValueError(f"optimizer.window: {partial.optimizer.window} is more than the {partial.optimizer.steps} steps")
    sigma = None
    if private:
        sigma = spec.mechanism.noise_multiplier
        if sigma == "auto":
            sigma = accountant(partial).calibrate(lambda z: planned_event(partial, n, z), epsilon,
                                                           float(delta))
        sigma = float(sigma)
    lr = opt.lr
    if lr == "auto":
        resolved_schedule = _manual(partial, d, n)
        lipschitz, _ = assumptions_of(spec)
        lr = presets.learning_rate(resolved_schedule, d, lipschitz, _node_std(partial, d, sigma, n))
    if scheduled and spec.mechanism.difference_noise_multiplier == "auto":
        ratio = filled["mechanism"]["difference_noise_multiplier"]
        filled = {**filled, "mechanism": {**filled["mechanism"], "difference_noise_multiplier": sigma * ratio}}
    final = spec.resolved(n_private=n_private, noise_multiplier=sigma,
                          filled={**filled, "optimizer": {**filled.get("optimizer", {}), "lr": float(lr)}})
    rate = spec_sampler(final, n).rate if spec.sampling.kind == "poisson" else 1.0
    if not private:
        return final, rate, math.inf
    eps = accountant(final).epsilon(planned_event(final, n, sigma), float(final.privacy.delta))
    if eps > epsilon * (1 + 1e-9):
        raise ValueError(f"mechanism.noise_multiplier: {sigma} gives epsilon {eps:.4g} > privacy.epsilon {epsilon}; "
                         "use noise_multiplier: auto or raise it")
    return final, rate, eps


def _fits(spec, rows, d, epsilon, mu, delta) -> bool:
    try:
        theory_preset(spec, rows, d, epsilon, mu, delta)
        return True
    except ValueError:
        return False


def _node_std(spec, d: int, sigma: Optional[float], n: int) -> float:
    """The std of the noise on a released gradient estimate (a tree node, or the baseline's Gaussian over
    its batch): sigma x Delta."""
    if sigma is None:
        return 0.0
    if spec.mechanism.kind == "scheduled_gaussian":  # a restart's std; a difference's follows the ratio
        return sigma * scheduled_sensitivities(spec, n)[0]
    if spec.estimator.kind in SPIDER_KINDS:
        return sigma * node_sensitivity(spec, d)
    return sigma * 2.0 * spec.mechanism.clip * math.sqrt(d) / spec.sampling.step_batch


def planned_event(spec, n_private: Optional[int], sigma: float):
    """The whole planned run at noise multiplier ``sigma``. A single pass: a row's J node releases (the tree's
    event), or its one Gaussian release. Multi-pass: the restarts and differences, each release on one
    batch, composed."""
    if spec.sampling.kind == "single_pass":
        if spec.mechanism.kind == "tree_aggregation":
            return tree_event(sigma, spec.sampling.period)
        return dp_accounting.GaussianDpEvent(sigma)
    sampler = spec_sampler(spec, n_private)
    if spec.mechanism.kind == "scheduled_gaussian":
        mech, steps = spec.mechanism, spec.planned_steps(n_private)
        starts = -(-steps // spec.estimator.period)
        return scheduled_event(sigma, sigma * mech.difference_noise_multiplier / mech.noise_multiplier, starts,
                               steps - starts, sampler.wrap)
    return dp_accounting.SelfComposedDpEvent(sampler.wrap(dp_accounting.GaussianDpEvent(sigma)),
                                             spec.planned_steps(n_private))
