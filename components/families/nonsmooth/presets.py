"""``optimizer.preset: theory``: hyperparameters of the private nonsmooth algorithms from their theorems.

Pure Python (no torch). Inputs are public: the number of private rows n (public under replace-one, the
only relation these algorithms run under), the dimension d, the spec's ``assumptions`` (Lipschitz constant
L, initial gap Phi), the smoothing radius r and the privacy target, as mu, the GDP parameter that is
exactly (epsilon, delta)-DP. Formulas are (Zhang et al., Theorem 4.9, with the node count
J = floor(log2 T) + 1 in place of 2 ln T), §2.3 (Zhang et al.'s Appendix E baseline, its sigma corrected to the
replace-one sensitivity 2dL/B) and §3.3 (Kornowski et al., Theorem 3.1, with coupled directions). Constants the
papers hide in O(.) are 1. The noise itself is never taken from these formulas: privzo calibrates the
node multiplier on the run's exact DpEvent; ``lr`` then takes the calibrated node std.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Callable, Mapping, Optional


def gdp_mu(epsilon: float, delta: float) -> float:
    """mu such that a mu-GDP mechanism (Gaussian of multiplier 1/mu) is exactly (epsilon, delta)-DP."""
    cdf = NormalDist().cdf

    def excess(mu):
        return cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * cdf(-epsilon / mu - mu / 2) - delta

    lo, hi = 1e-9, 100.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if excess(mid) > 0 else (mid, hi)
    return lo


def tree_depth(period: int) -> int:
    return period.bit_length()


@dataclass(frozen=True)
class Schedule:
    """A resolved schedule. ``steps`` = windows x window for Zhang et al. (a window is an epoch and a tree period),
    T for Kornowski et al.; the tree's period is ``period``; rows: start_batch at each period start, step_batch
    otherwise. Clips are per example, in privzo units (directions on the sphere of radius sqrt(d)):
    ``start_clip`` bounds the period-start estimate, ``difference_clip`` a difference estimate at the
    a-priori largest move 2D; ``clip_mode`` says whether each is a bound on every direction's scalar
    coefficient (Zhang et al., naive) or on the per-example vector (Kornowski et al.)."""

    # original (Zhang et al.), original_naive (their baseline), improved (Kornowski et al.), improved_fo (its
    # first-order oracle)
    algorithm: str
    steps: int
    window: int
    period: int
    start_batch: int
    step_batch: int
    step_bound: float
    start_directions: int
    directions: int
    clip_mode: str
    start_clip: float
    difference_clip: float
    restart: bool
    radius: float
    rows_used: int
    predicted: float  # the theorem's bound on E |Goldstein subgradient| at 2r, its constants and logs 1
    # multi-pass (Kornowski et al.'s Theorem 4.1): the paper's ratio of the difference releases' noise std to the
    # start releases' (sigma_2 / sigma_1); one scale is calibrated on the run's event
    difference_noise_ratio: float = 1.0
    multi_pass: bool = False
    # Kornowski et al. zeroth-order: a difference's two points on the same directions (a deviation from the
    # paper, which draws them independently) or not
    coupled: bool = True

    def as_dict(self) -> dict:
        return asdict(self)


def _001_steps(n: int, d: int, lipschitz: float, gap_hat: float, radius: float, mu: float) -> int:
    # mu = inf (no privacy): only the first, non-private, branch
    private = (d ** 1.5 * lipschitz * radius * n / (gap_hat * mu)) ** 0.5 if math.isfinite(mu) else math.inf
    return int(min((math.sqrt(d) * lipschitz * radius * n / gap_hat) ** (2 / 3), private))


def _needed_rows(fits: Callable[[int], bool], start: int) -> int:
    """The smallest n >= start for which ``fits(n)`` (monotone in n): doubling, then bisection."""
    lo, hi = start, max(start, 2)
    while not fits(hi):
        lo, hi = hi, hi * 2
        if hi > 10 ** 15:
            raise ValueError("preset: no number of rows below 1e15 fits")
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi


def preset_001(n: int, d: int, lipschitz: float, initial_gap: float, radius: float, mu: float) -> Schedule:
    """Zhang, Tran and Cutkosky, Theorem 4.9: T rounds an epoch, K epochs, B1 = T + 1 rows at an epoch's start and 1 row
    a round after, D = r / T, d directions per row, scalar clip C_s = L sqrt(d) on every coefficient (it
    never binds on an L-Lipschitz loss)."""
    gap_hat = initial_gap + lipschitz * radius

    def fits(rows):
        t = _001_steps(rows, d, lipschitz, gap_hat, radius, mu)
        return t >= 2 and rows // (2 * t) >= 1

    if not fits(n):
        raise ValueError(f"optimizer.preset theory: {n} private rows are too few for Zhang et al.'s schedule (it needs "
                         f"at least 2 rounds an epoch and one epoch: {_needed_rows(fits, n)} rows)")
    t = _001_steps(n, d, lipschitz, gap_hat, radius, mu)
    k = n // (2 * t)
    clip = lipschitz * math.sqrt(d)
    predicted = (gap_hat * d * lipschitz ** 2 / (radius * n)) ** (1 / 3) + (
        gap_hat * d ** 1.5 * lipschitz / (mu * radius * n)) ** 0.5
    return Schedule("original", steps=k * t, window=t, period=t, start_batch=t + 1, step_batch=1, step_bound=radius / t,
                    start_directions=d, directions=d, clip_mode="scalar", start_clip=clip, difference_clip=clip,
                    restart=True, radius=radius, rows_used=k * (t + 1 + (t - 1)), predicted=predicted)


def preset_001_naive(n: int, d: int, lipschitz: float, initial_gap: float, radius: float, mu: float) -> Schedule:
    """Zhang, Tran and Cutkosky, Appendix E: one row and one direction a round, T rounds an epoch, K = n / T epochs."""
    gap_hat = initial_gap + lipschitz * radius

    def rounds(rows):
        private = (d ** 1.5 * lipschitz * radius * rows / (gap_hat * mu)) ** (2 / 3) if math.isfinite(mu) else math.inf
        return int(min((math.sqrt(d) * lipschitz * radius * rows / gap_hat) ** (2 / 3), private))

    def fits(rows):
        t = rounds(rows)
        return t >= 1 and rows // t >= 1

    if not fits(n):
        raise ValueError(f"optimizer.preset theory: {n} private rows are too few for Zhang et al.'s baseline "
                         f"({_needed_rows(fits, n)} rows)")
    t = rounds(n)
    k = n // t
    clip = lipschitz * math.sqrt(d)
    predicted = (gap_hat * d * lipschitz ** 2 / (radius * n)) ** (1 / 3) + (
        gap_hat * d ** 3 * lipschitz ** 2 / (mu ** 2 * radius * n)) ** (1 / 3)
    return Schedule("original_naive", steps=k * t, window=t, period=1, start_batch=1, step_batch=1,
                    step_bound=radius / t, start_directions=1, directions=1, clip_mode="scalar", start_clip=clip,
                    difference_clip=clip, restart=True, radius=radius, rows_used=k * t, predicted=predicted)


# the constants the theorems hide, 1 under preset theory (theory_shape sets them)
DEFAULT_CONSTANTS = {"c_D": 1.0, "c_Sigma": 1.0, "c_T": 1.0, "c_h": 1.0, "c_s": 1.0}


def _002_step_bound(steps: int, d: int, lipschitz: float, gap: float, radius: float, epsilon: float,
                    c_d: float = 1.0) -> float:
    return c_d * min((gap ** 2 * radius / (lipschitz ** 2 * steps ** 2)) ** (1 / 3),
               (gap * radius * epsilon / (d * lipschitz * steps)) ** 0.5,
               (gap ** 3 * radius ** 2 * epsilon / (d ** 1.5 * lipschitz ** 3 * steps ** 3)) ** 0.2,
               (gap ** 2 * radius / (lipschitz ** 2 * steps ** 2 * math.sqrt(d))) ** (1 / 3))


def _002_layout(n: int, d: int, lipschitz: float, gap: float, radius: float, epsilon: float, c_d: float = 1.0,
                c_sigma: float = 1.0):
    steps = n // 2
    for _ in range(60):  # shrink T until the single pass fits in n rows
        if steps < 1:
            return None
        bound = _002_step_bound(steps, d, lipschitz, gap, radius, epsilon, c_d)
        period = max(1, math.ceil(c_sigma * ((radius / (epsilon * bound)) ** (2 / 3) + radius / (bound * math.sqrt(d)))))
        periods = math.ceil(steps / period)
        rows = periods * period + (steps - periods)
        if rows <= n:
            return steps, bound, period, rows
        steps = int(steps * n / rows) - 1
    return None


def preset_002(n: int, d: int, lipschitz: float, initial_gap: float, radius: float, epsilon: float,
               concentration_delta: float, first_order: bool = False, coupled: bool = True,
               constants: Optional[Mapping[str, float]] = None) -> Schedule:
    """Kornowski, Liu and Talwar, Theorem 3.1: T = n/2 steps shrunk to fit one pass, B1 = Sigma rows at a
    period start, 1 after; windows of W = alpha / (4D); vector clips at the concentration bounds (c_h = c_s
    = 1). Privacy rests on the clips, not on the concentration event. Directions per row: the paper's
    (Lemma 3.5) m = log(8 d B2 / delta_0)(d^2 B1^2 + d alpha^2 B2^2 / D^2) everywhere, the two points of a
    difference on independent ones, C_G = L (1 + d sqrt(log(8 d B1 / delta_0) / m)), C_Delta = sqrt(d) L 2D
    / alpha + 2 L d sqrt(log(8 d B2 / delta_0) / m); or (``coupled``, privzo's deviation from the paper) m_G = d^2
    log(8 d B1 / delta_0) at a period start and m_D = 4 d log(8 d / delta_0) shared by both points of a
    difference, C_Delta = 2 sqrt(d) L 2D / alpha.

    ``constants`` (preset theory_shape): c_D and c_Sigma scale D and Sigma, c_h the concentration terms of the
    clips (and the coupled m_G, m_D by c_h^2), c_s the smoothness term of C_Delta; each 1 by default.

    ``first_order``: Theorem 6.1, the same schedule with gradients at points drawn uniformly
    from the ball of radius alpha: one per row at a period start (clip L, which an L-Lipschitz loss never
    exceeds), m_D = log(8 d B2 / delta_0) B2^2 alpha^2 / (D^2 d) independent ones at each point of a
    difference (Lemma 6.4), clipped at Lemma 6.3's bound sqrt(d) L 2D / alpha + 2 L sqrt(log(8 d B2 /
    delta_0) / m_D)."""
    if radius > initial_gap / lipschitz:
        raise ValueError(f"estimator.radius: Kornowski et al. needs radius <= initial_gap / lipschitz = "
                         f"{initial_gap / lipschitz:.4g}")

    c = {**DEFAULT_CONSTANTS, **(constants or {})}

    def fits(rows):
        layout = _002_layout(rows, d, lipschitz, initial_gap, radius, epsilon, c["c_D"], c["c_Sigma"])
        return layout is not None and max(1, int(radius / (4 * layout[1]))) <= layout[0]

    if not fits(n):
        raise ValueError(f"optimizer.preset theory: {n} private rows are too few for Kornowski et al.'s schedule "
                         f"({_needed_rows(fits, n)} rows)")
    steps, bound, period, rows = _002_layout(n, d, lipschitz, initial_gap, radius, epsilon, c["c_D"], c["c_Sigma"])
    window = max(1, int(radius / (4 * bound)))
    log_start = math.log(8 * d * period / concentration_delta)
    log_step = math.log(8 * d / concentration_delta)
    if first_order:
        start_directions = 1
        directions = max(1, math.ceil(log_step * radius ** 2 / (bound ** 2 * d)))
        start_clip = lipschitz
        difference_clip = (c["c_s"] * math.sqrt(d) * lipschitz * 2 * bound / radius
                           + 2 * c["c_h"] * lipschitz * math.sqrt(log_step / directions))
    elif coupled:
        start_directions = math.ceil(c["c_h"] ** 2 * d * d * log_start)
        directions = math.ceil(c["c_h"] ** 2 * 4 * d * log_step)
        start_clip = lipschitz * (1 + c["c_h"] * d * math.sqrt(log_start / start_directions))
        difference_clip = c["c_s"] * math.sqrt(d) * lipschitz * 2 * bound / radius * 2
    else:
        start_directions = directions = math.ceil(log_step * (d * d * period ** 2 + d * radius ** 2 / bound ** 2))
        start_clip = lipschitz * (1 + c["c_h"] * d * math.sqrt(log_start / directions))
        difference_clip = (c["c_s"] * math.sqrt(d) * lipschitz * 2 * bound / radius
                           + 2 * c["c_h"] * lipschitz * d * math.sqrt(log_step / directions))
    predicted = ((initial_gap * lipschitz ** 2 * math.sqrt(d) / (n * radius)) ** (1 / 3)
                 + (initial_gap * d * lipschitz / (n * radius * epsilon)) ** 0.5
                 + (initial_gap ** 2 * lipschitz ** 3 * d ** 1.5 / (n * n * radius ** 2 * epsilon)) ** 0.2)
    return Schedule("improved_fo" if first_order else "improved", steps=(steps // window) * window, window=window,
                    period=period, start_batch=period, step_batch=1, step_bound=bound,
                    start_directions=start_directions, directions=directions, clip_mode="vector",
                    start_clip=start_clip, difference_clip=difference_clip, restart=False, radius=radius,
                    rows_used=rows, predicted=predicted, coupled=coupled and not first_order)


def preset_002_multi_pass(n: int, d: int, lipschitz: float, initial_gap: float, radius: float, target: float,
                          epsilon: float, delta: float, concentration_delta: float,
                          first_order: bool = False, batch: Optional[int] = None, coupled: bool = True,
                          constants: Optional[Mapping[str, float]] = None) -> Schedule:
    """Kornowski, Liu and Talwar, Theorem 4.1: full-batch ERM, every row in every step, for a target
    beta of the empirical Goldstein certificate: T = Phi L^2 / (alpha^2 beta^3) steps of bound D = alpha^2
    beta^2 / L^2, restarts every Sigma = alpha / (D sqrt(d)) steps, windows of W = alpha / D, the noise of
    a restart's release and of a difference's in the paper's ratio sigma_2 / sigma_1 = D sqrt(d Sigma) /
    alpha (one scale calibrated on the run's event), m = L^2 d Sigma / (n sigma_1^2) + L^2 d / (n
    sigma_2^2) directions per row at both (the paper's sigmas; d times fewer ball points first-order,
    the improved paper). Clips: first-order L at a restart (never binds) and Lemma 6.3's sqrt(d) L 2D / alpha + 2 L
    sqrt(log(8 d n / delta_0) / m) on a difference; zeroth-order L (1 + d sqrt(log(8 d n / delta_0) / m)) and,
    a difference's points on independent directions (the paper's), sqrt(d) L 2D / alpha + 2 L d sqrt(log(8
    d n / delta_0) / m), or on the same ones (``coupled``, privzo's deviation from the paper) 2 sqrt(d) L 2D / alpha. ``predicted`` is the privacy excess at this fixed
    schedule, L sqrt(D T log(1/delta)) d^(3/4) / (n epsilon sqrt(alpha)): exponent -1 in n.

    ``batch``: the footnote-2 variant's expected Poisson batch b (default n, the full batch). The paper gives
    it no preset; Theorem 4.1's T, D, Sigma and W are kept, the batch mean's variance terms take b for n (m
    from L^2 d Sigma / (b sigma_1^2) + L^2 d / (b sigma_2^2)), and the noise is calibrated on the subsampled
    event as for a full batch (the sigmas here only set m and the stds' ratio).

    ``constants`` (preset theory_shape): c_T and c_D scale T and D, c_h and c_s the clips' terms as in
    ``preset_002``; each 1 by default."""
    c = {**DEFAULT_CONSTANTS, **(constants or {})}
    if not 0 < target:
        raise ValueError("optimizer.target_stationarity: Kornowski et al.'s multi-pass preset needs a target beta > 0")
    steps = math.ceil(c["c_T"] * initial_gap * lipschitz ** 2 / (radius ** 2 * target ** 3))
    bound = c["c_D"] * radius ** 2 * target ** 2 / lipschitz ** 2
    period = max(1, math.ceil(radius / (bound * math.sqrt(d))))
    window = max(1, int(radius / bound))
    if window > steps:
        raise ValueError(f"optimizer.target_stationarity: {target:g} gives {steps} steps, fewer than one window of "
                         f"{window}")
    log_delta = math.log(1 / delta)
    sigma_1 = lipschitz * math.sqrt(steps * log_delta / period) / (n * epsilon)
    sigma_2 = lipschitz * bound * math.sqrt(steps * d * log_delta) / (radius * n * epsilon)
    scale = 1 if first_order else d
    rows = n if batch is None else int(batch)
    if not 0 < rows <= n:
        raise ValueError(f"sampling.expected_batch_size: {rows} must be between 1 and the {n} rows")
    directions = max(1, math.ceil(lipschitz ** 2 * scale * period / (rows * sigma_1 ** 2)
                                  + lipschitz ** 2 * scale / (rows * sigma_2 ** 2)))
    log_n = math.log(8 * d * n / concentration_delta)
    smooth = c["c_s"] * math.sqrt(d) * lipschitz * 2 * bound / radius
    if first_order:
        start_clip = lipschitz
        difference_clip = smooth + 2 * c["c_h"] * lipschitz * math.sqrt(log_n / directions)
    else:
        start_clip = lipschitz * (1 + c["c_h"] * d * math.sqrt(log_n / directions))
        difference_clip = 2 * smooth if coupled else smooth + 2 * c["c_h"] * lipschitz * d * math.sqrt(log_n / directions)
    predicted = lipschitz * math.sqrt(bound * steps * log_delta) * d ** 0.75 / (n * epsilon * math.sqrt(radius))
    return Schedule("improved_fo" if first_order else "improved", steps=(steps // window) * window, window=window,
                    period=period, start_batch=rows, step_batch=rows, step_bound=bound, start_directions=directions,
                    directions=directions, clip_mode="vector", start_clip=start_clip, difference_clip=difference_clip,
                    restart=False, radius=radius, rows_used=n, predicted=predicted,
                    difference_noise_ratio=sigma_2 / sigma_1, multi_pass=True, coupled=coupled and not first_order)


def vector_bounds(schedule: Schedule, d: int) -> tuple:
    """Per-example L2 bounds of (start estimate, difference estimate at the largest move 2D)."""
    scale = math.sqrt(d) if schedule.clip_mode == "scalar" else 1.0
    if schedule.algorithm == "original":
        # Zhang et al.'s difference clip scales with the move: C_s |z_t - z_(t-1)| / r <= C_s 2D / r
        return schedule.start_clip * scale, schedule.difference_clip * scale * 2 * schedule.step_bound / schedule.radius
    return schedule.start_clip * scale, schedule.difference_clip * scale


def node_sensitivity(schedule: Schedule, d: int, kappa: float = 2.0) -> float:
    """Delta_max: the most one row moves a released increment, replace-one (kappa = 2): kappa times its
    per-example bound over its batch, the larger of a period start and a difference step."""
    start, diff = vector_bounds(schedule, d)
    return kappa * max(start / schedule.start_batch, diff / schedule.step_batch)


def second_moment(schedule: Schedule, d: int, lipschitz: float, node_std: float) -> float:
    """G^2, the bound on E|g_t|^2 that sets eta = D / (G sqrt(W)) (Zhang et al. Lemma 4.8 and Cor. 4.5; Kornowski et al. Lemma 3.6
    with the coupled difference; Kornowski et al.'s first-order oracle, Lemma 6.5; Zhang et al.'s baseline: L^2 (d + 1) + d sigma^2)."""
    j = tree_depth(schedule.period)
    if schedule.algorithm == "original":
        return (3 * (16 * d * lipschitz ** 2 / schedule.start_batch + 64 * d * lipschitz ** 2 / (
            schedule.step_batch * schedule.window)) + 3 * lipschitz ** 2 + 3 * j * d * node_std ** 2)
    if schedule.algorithm == "original_naive":
        return lipschitz ** 2 * (d + 1) + d * node_std ** 2
    if schedule.multi_pass:  # Lemma 4.4, node_std the restart's std (a difference's in the paper's ratio)
        spread = 1.0 if schedule.algorithm == "improved_fo" else d * d
        return (lipschitz ** 2 + lipschitz ** 2 * spread * schedule.period / (schedule.directions * schedule.start_batch)
                + d * node_std ** 2 + d * schedule.period * (schedule.difference_noise_ratio * node_std) ** 2)
    if schedule.algorithm == "improved_fo":  # Lemma 6.5
        return (lipschitz ** 2 + lipschitz ** 2 / schedule.start_batch
                + lipschitz ** 2 * d * schedule.step_bound ** 2 * schedule.period / (schedule.radius ** 2 * schedule.step_batch)
                + lipschitz ** 2 * schedule.period / (schedule.directions * schedule.step_batch) + j * d * node_std ** 2)
    independent = 0.0 if schedule.coupled else (  # the paper's directions: their own variance in a difference
        lipschitz ** 2 * d * d * schedule.period / (schedule.directions * schedule.step_batch))
    return (lipschitz ** 2 + lipschitz ** 2 * d * d / (schedule.start_batch * schedule.start_directions)
            + lipschitz ** 2 * d * schedule.step_bound ** 2 * schedule.period / (schedule.radius ** 2 * schedule.step_batch)
            + j * d * node_std ** 2 + independent)


def learning_rate(schedule: Schedule, d: int, lipschitz: float, node_std: float) -> float:
    """eta = D / (G sqrt(W)) (Kornowski et al.'s Proposition 2.6; Zhang et al. leaves eta to the online learner's tuning)."""
    return schedule.step_bound / math.sqrt(second_moment(schedule, d, lipschitz, node_std) * schedule.window)


def multi_pass_rows_needed(d: int, lipschitz: float, initial_gap: float, radius: float, target: float,
                           epsilon: float) -> int:
    """Theorem 4.1's n for a target beta of the empirical certificate, constants and logs 1:
    sqrt(Phi) L d^(3/4) / (epsilon alpha^(1/2) beta^(3/2))."""
    return math.ceil(math.sqrt(initial_gap) * lipschitz * d ** 0.75 / (epsilon * math.sqrt(radius) * target ** 1.5))


def rows_for_target(predict: Callable[[int], float], target: float, start: int) -> Optional[int]:
    """The smallest n whose predicted stationarity is at most ``target``."""
    return _needed_rows(lambda rows: predict(rows) <= target, max(2, start))
