"""Planning the KL paper's private algorithms (KL-Spider, the private proximal point method, adaptive noisy GD):
the theory presets' schedules, and the noise that makes the planned releases compose to exactly the target.

Every algorithm here is full batch under replace-one neighbours, so one row moves the mean of per-example
vectors clipped at C by at most Delta = 2C / n, and a Gaussian release of std s costs Delta^2 / (2 s^2) in
zCDP (Bun and Steinke 2016); privzo recomputes every cost from the clip and the std it uses, never from the
paper's formulas. The privacy target (epsilon, delta) is first turned into the one Gaussian that meets it
under the run's accountant, of multiplier z; rho = 1 / (2 z^2) is the budget the plan is scaled to. A
composition of Gaussians whose costs add to rho *is* that Gaussian (mu-GDP composes exactly), so the planned
event meets the target exactly, and a privacy filter on the realised costs keeps every run (early stops,
retries, adaptive noise) inside it.

Where the paper is wrong (checked against its text here):
- KL-Spider as printed costs (17/8) rho under replace-one (full gradients 2 rho, differences rho / 8): the
  stds here are scaled by one factor calibrated on the plan, which is never more than sqrt(17/8).
- Its loop releases a difference after the last step of a phase that nothing uses: here a phase releases
  at most T_k - 1 differences (a loop fixed at T_k steps would spend one per phase for nothing).
- Adaptive GD's printed per-step cost is half the true one under replace-one, and computing it from the
  released norm N_t (line 6) undercharges without bound when N_t is negative: the cost here is computed
  from the std actually used.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import dp_accounting

from components.accountants.accounting import event_rho
from components.families.common import accountant as accountant_for
from specs.traits import KL_OPTIMIZERS as KL_KINDS, KL_PROBLEMS


@dataclass(frozen=True)
class KlAssumptions:
    lipschitz: float  # L0
    smoothness: Optional[float]  # L1
    weak_convexity: Optional[float]  # L~1
    initial_gap: Optional[float]  # F0
    gamma: Optional[float]
    kappa: Optional[float]
    beta: float
    radius: Optional[float]


def synthetic_rows(spec):
    """A synthetic KL problem's rows: a public function of the spec (its seed), so the problem's exact
    constants may read them."""
    from components.families.kl.problems import kl_rows

    source = spec.data.source
    return kl_rows(source.problem, source.dimension, source.rows, source.data_seed)


def kl_assumptions(spec) -> KlAssumptions:
    """The spec's assumptions, each one it leaves auto filled by a synthetic KL problem's own exact value."""
    given = spec.assumptions
    source = spec.data.source

    def value(name):
        v = getattr(given, name, "auto") if given is not None else "auto"
        return None if v in ("auto", None) else float(v)

    kl = given.kl if given is not None else None
    radius = value("radius")
    known = None
    if source.kind == "synthetic" and source.problem in KL_PROBLEMS:
        from components.families.kl.problems import kl_constants

        known = kl_constants(source.problem, source.dimension, float(source.start), radius or 1.0,
                             synthetic_rows(spec))
    out = {}
    for name in ("lipschitz", "smoothness", "weak_convexity", "initial_gap"):
        out[name] = value(name)
        if out[name] is None and known is not None:
            out[name] = getattr(known, name)
    gamma = kl.gamma if kl is not None else (known.gamma if known is not None else None)
    kappa = kl.kappa if kl is not None else (known.kappa if known is not None else None)
    beta = given.failure_probability if given is not None else 0.1
    return KlAssumptions(out["lipschitz"], out["smoothness"], out["weak_convexity"], out["initial_gap"], gamma, kappa,
                         float(beta), radius if radius is not None else (1.0 if known is not None else None))


def _need(a: KlAssumptions, *names: str) -> None:
    for name in names:
        if getattr(a, name) is None:
            raise ValueError(f"assumptions.{name}: the KL paper's preset needs it (a synthetic KL problem knows its own)")


def _bracket(n: int, d: int, rho: float, a: KlAssumptions) -> float:
    """log F0 + kappa log(n sqrt(rho) / (gamma L0 sqrt(d))): the phases' log factor (must be > 0)."""
    value = math.log(a.initial_gap) + a.kappa * math.log(n * math.sqrt(rho) / (a.gamma * a.lipschitz * math.sqrt(d)))
    if value <= 0:
        raise ValueError(f"data: n = {n} rows are too few for the KL paper's preset at rho = {rho:.4g} (log F0 + kappa "
                         f"log(n sqrt(rho) / (gamma L0 sqrt d)) = {value:.3g} <= 0: nothing to gain)")
    return value


def scale_to(rho: float, releases) -> float:
    """The factor c making releases (count, sensitivity, unscaled std) cost exactly rho in all."""
    unit = sum(count * delta ** 2 / (2 * std ** 2) for count, delta, std in releases if count > 0)
    return math.sqrt(unit / rho)


@dataclass(frozen=True)
class KlSpiderPlan:
    phases: int  # K
    targets: Tuple[float, ...]  # Phi_k
    lengths: Tuple[int, ...]  # T_k: the most updates of phase k
    step_lengths: Tuple[float, ...]  # Phi_k^(1/kappa) / (4 gamma L1)
    thresholds: Tuple[float, ...]  # (7 / (8 gamma)) Phi_k^(1/kappa): the phase stops below it
    difference_clips: Tuple[float, ...]  # c_k = L1 x step length: what one row's difference can measure
    start_clip: float  # C0
    start_std: float  # sigma-hat
    difference_stds: Tuple[float, ...]  # sigma_k
    noise_scale: float  # c_sigma: the one factor on the paper's stds (<= sqrt(17/8) with C0 = L0)
    rows: int
    floor: float  # the phases' lowest target: the predicted excess risk
    radius: float  # Lemma 1's bound on |w - w0|

    @property
    def releases(self) -> int:
        return self.phases + sum(t - 1 for t in self.lengths)

    def multipliers(self):
        """(count, multiplier) of each release class: the phases' full gradients, then each phase's differences."""
        d0 = 2 * self.start_clip / self.rows
        out = [(self.phases, self.start_std / d0)]
        out += [(t - 1, s / (2 * c / self.rows)) for t, s, c in zip(self.lengths, self.difference_stds,
                                                                    self.difference_clips)]
        return out


def plan_kl_spider(n: int, d: int, rho: float, a: KlAssumptions, clip: float, c_K: float = 64.0,
                   c_floor: float = 32.0) -> KlSpiderPlan:
    """Algorithm 1's lines 2-7 (with the corrections listed above): every quantity from public inputs only."""
    _need(a, "lipschitz", "smoothness", "initial_gap", "gamma", "kappa")
    gamma, kappa, L0, L1, F0 = a.gamma, a.kappa, a.lipschitz, a.smoothness, a.initial_gap
    if not 1.0 <= kappa <= 2.0:
        raise ValueError(f"assumptions.kl.kappa: kl_spider is for kappa in [1, 2], not {kappa:g}")
    bracket = _bracket(n, d, rho, a)
    shrink = 1 + F0 ** ((2 - kappa) / kappa) / (c_K * gamma ** 2 * L1)
    K = math.ceil((1 + c_K * (1 / F0) ** ((2 - kappa) / kappa) * gamma ** 2 * L1) * bracket)
    beta_p = (a.beta / K) * (gamma * L0 * math.sqrt(K * d) / (n * math.sqrt(rho) * F0 ** (1 / kappa))) ** (2 - kappa)
    bound = math.sqrt(17 / 8)  # the noise factor's largest value (clip L0): the floor keeps Lemma 2's margin with it
    floor = (c_floor * bound * gamma * L0 * math.sqrt(K * d * math.log(1 / beta_p)) / (n * math.sqrt(rho))) ** kappa
    if floor >= F0:
        raise ValueError(f"data: n = {n} rows are too few for kl_spider's preset: its noise floor {floor:.3g} is not "
                         f"below the initial gap {F0:.3g} (preset theory_shape lowers the constants)")
    targets, lengths = [], []
    phi = F0
    for _ in range(K):
        phi = max(phi / shrink, floor)
        targets.append(phi)
        lengths.append(math.ceil((F0 / phi) ** ((2 - kappa) / kappa) - 1e-12))
    roots = [t ** (1 / kappa) for t in targets]
    step_lengths = tuple(r / (4 * gamma * L1) for r in roots)
    clips = tuple(L1 * s for s in step_lengths)
    start = L0 * math.sqrt(K) / (n * math.sqrt(rho))
    diffs = [r * math.sqrt(t * K) / (gamma * n * math.sqrt(rho)) for r, t in zip(roots, lengths)]
    c = scale_to(rho, [(K, 2 * clip / n, start)] + [(t - 1, 2 * ck / n, s) for t, ck, s in zip(lengths, clips, diffs)])
    return KlSpiderPlan(K, tuple(targets), tuple(lengths), step_lengths, tuple(7 * r / (8 * gamma) for r in roots),
                        clips, clip, c * start, tuple(c * s for s in diffs), c, n, floor,
                        K * F0 ** (1 / kappa) / (4 * gamma * L1))


@dataclass(frozen=True)
class ProximalPlan:
    outer: int  # T
    inner: int  # T_in: iterates of each inner noisy GD (T_in - 1 releases)
    weak_convexity: float
    radius: float  # L0 / (2 L~1): the inner projection ball
    clip: float
    std: float
    rows: int
    predicted: float

    @property
    def releases(self) -> int:
        return self.outer * (self.inner - 1)

    def multipliers(self):
        return [(self.releases, self.std / (2 * self.clip / self.rows))]


def plan_proximal_point(n: int, d: int, rho: float, a: KlAssumptions, clip: float, c_T: float = 32.0,
                        log_factor: bool = True) -> ProximalPlan:
    """Algorithm 2 with Algorithm 4 inside (Theorem 9's T_in, eta_s = 1 / (L~1 s), projection radius
    L0 / (2 L~1)); the inner stds one value, scaled so all T (T_in - 1) releases cost exactly rho (the paper's
    sigma^2 = 4 L0^2 T_in / (n^2 rho_in) costs rho / 2)."""
    _need(a, "lipschitz", "weak_convexity", "initial_gap", "gamma", "kappa")
    gamma, kappa, L0, Lw, F0 = a.gamma, a.kappa, a.lipschitz, a.weak_convexity, a.initial_gap
    if kappa < 2.0:
        raise ValueError(f"assumptions.kl.kappa: proximal_point is for kappa >= 2, not {kappa:g}")
    bracket = _bracket(n, d, rho, a)
    outer = math.ceil((1 + c_T * F0 ** ((kappa - 2) / kappa) * gamma ** 2 * Lw) * bracket)
    beta_p = a.beta / outer
    rho_in = rho / outer
    inner = max(2, math.ceil(n * n * rho_in * (math.log(2 / beta_p) ** 2 if log_factor else 1.0) / d))
    releases = outer * (inner - 1)
    std = math.sqrt(releases / (2 * rho)) * 2 * clip / n
    predicted = (gamma * L0 * math.sqrt(outer * d) / (n * math.sqrt(rho))) ** kappa
    return ProximalPlan(outer, inner, Lw, L0 / (2 * Lw), clip, std, n, predicted)


@dataclass(frozen=True)
class AdaptivePlan:
    lr: float
    clip: float
    rows: int
    norm_std: float  # sigma-hat = C0 / (sqrt(n) rho^(1/4))
    floor: float  # the gradient's least std, 2 C0 / (n sqrt(rho))
    divisor: float  # sqrt(d log(n sqrt(rho) / beta)): sigma_t = max(N_t / divisor, floor)
    budget: float  # rho of the run's releases
    threshold: float  # the filter: another step only while spent <= budget - the most one step costs
    selection_rho: float  # the exponential mechanism's zCDP (0: select last)
    selection_scale: float  # lambda: P(t) ~ exp(-lambda |clipped mean gradient at w_t|)
    max_steps: int

    @property
    def sensitivity(self) -> float:
        return 2 * self.clip / self.rows

    def cost(self, std: float) -> float:
        return self.sensitivity ** 2 / (2 * std ** 2)

    def std_for(self, norm: float) -> float:
        return max(norm / self.divisor, self.floor)


def plan_adaptive(n: int, d: int, rho: float, a: KlAssumptions, clip: float, lr: Optional[float],
                  select: str = "last") -> AdaptivePlan:
    """Algorithm 3's constants with the privacy of each release exact: the filter spends at most rho on the
    releases; with select exponential a third of rho goes to the selection (the paper's rho : rho / 2)."""
    selection = rho / 3 if select == "exponential" else 0.0
    budget = rho - selection
    if lr is None:
        _need(a, "smoothness")
        lr = 1 / (2 * a.smoothness)
    norm_std = clip / (math.sqrt(n) * budget ** 0.25)
    floor = 2 * clip / (n * math.sqrt(budget))
    divisor = math.sqrt(d * max(math.log(n * math.sqrt(budget) / a.beta), 1.0))
    delta = 2 * clip / n
    most = delta ** 2 / (2 * norm_std ** 2) + delta ** 2 / (2 * floor ** 2)
    threshold = budget - most
    if threshold < 0:
        raise ValueError(f"data: n = {n} rows are too few for adaptive_noisy_gd at rho = {rho:.4g}: one step may cost "
                         f"{most:.4g}, more than the budget")
    least = delta ** 2 / (2 * norm_std ** 2)
    epsilon_em = math.sqrt(8 * selection)
    return AdaptivePlan(float(lr), clip, n, norm_std, floor, divisor, budget, threshold, selection,
                        epsilon_em / (2 * delta) if selection else 0.0,
                        int(threshold // least) + 1 + (select == "exponential"))


def rho_of(multiplier: float) -> float:
    return 1.0 / (2.0 * multiplier ** 2)


def plan_for(spec, n: int, d: int, multiplier: float):
    """The resolved spec's plan at the run's budget rho = 1 / (2 multiplier^2)."""
    opt, rho = spec.optimizer, rho_of(multiplier)
    a = kl_assumptions(spec)
    clip = float(spec.mechanism.clip) if spec.mechanism.clip != "auto" else a.lipschitz
    if clip is None:
        raise ValueError("mechanism.clip: auto needs assumptions.lipschitz")
    shape = getattr(opt, "preset", "theory") == "theory_shape"
    constants = {name: float(opt.constants.get(name, 1.0)) for name in ("c_K", "c_floor", "c_T")} if shape else {}
    if opt.kind == "kl_spider":
        return plan_kl_spider(n, d, rho, a, clip, constants.get("c_K", 64.0), constants.get("c_floor", 32.0))
    if opt.kind == "proximal_point":
        return plan_proximal_point(n, d, rho, a, clip, constants.get("c_T", 32.0), opt.log_factor)
    lr = None if opt.lr == "auto" else float(opt.lr)
    return plan_adaptive(n, d, rho, a, clip, lr, opt.select)


def plan_event(plan) -> dp_accounting.DpEvent:
    """A fixed plan's releases as the composition they are: its full gradients, then each phase's differences
    (KL-Spider), or the inner steps (PPM), each class a Gaussian of its multiplier std / Delta."""
    parts = [dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), count)
             for count, z in plan.multipliers() if count > 0]
    return parts[0] if len(parts) == 1 else dp_accounting.ComposedDpEvent(parts)


def charged_event(spec, multiplier: float) -> dp_accounting.DpEvent:
    """What a run is charged (and reserves) whatever it executes: a fixed plan is scaled to compose to exactly
    the Gaussian of this multiplier, and its early stops and retries are kept inside it by the filter (Smith
    and Thakurta's mu-GDP filter), so that Gaussian; adaptive GD, its filter's budget as one Gaussian (gdp) or
    a zCDP event (zcdp), plus the selection's zCDP with select exponential (a third of rho)."""
    rho = rho_of(multiplier)
    if spec.optimizer.kind != "adaptive_noisy_gd":
        return dp_accounting.GaussianDpEvent(multiplier)
    select = spec.optimizer.select == "exponential"
    budget = rho * (2 / 3 if select else 1.0)
    run = dp_accounting.ZCDpEvent(budget) if spec.mechanism.filter == "zcdp" else \
        dp_accounting.GaussianDpEvent(1.0 / math.sqrt(2 * budget))
    return dp_accounting.ComposedDpEvent([run, dp_accounting.ZCDpEvent(rho / 3)]) if select else run


def step_cost_bound(plan) -> float:
    """The most one step can add to the realised spend (a killed process is charged it per step)."""
    if isinstance(plan, AdaptivePlan):
        return plan.budget - plan.threshold + plan.selection_rho
    return max(1.0 / (2 * z ** 2) for count, z in plan.multipliers() if count > 0)


def planned_event(spec, n: int, multiplier: float) -> dp_accounting.DpEvent:
    """The event a resolved run reserves and is charged (``n`` is not needed: the plan is scaled to it)."""
    return charged_event(spec, multiplier)


def resolve_kl(spec, n_private: Optional[int], dimension: Optional[int]):
    """(resolved spec, sampling rate 1, planned epsilon) of a KL-family run; refuses in one line a spec whose
    rows cannot carry its preset."""
    source = spec.data.source
    d = dimension if dimension is not None else (source.dimension if source.kind == "synthetic" else None)
    if d is None:
        raise ValueError(f"optimizer.kind: {spec.optimizer.kind} needs the model's dimension to plan (pass the data)")
    n = spec.public_rows(n_private)
    a = kl_assumptions(spec)
    delta = spec.delta_for(n_private)
    epsilon = float(spec.privacy.epsilon)
    filled = {"optimizer": {}, "mechanism": {}}
    if spec.mechanism.clip == "auto":
        filled["mechanism"]["clip"] = a.lipschitz
    if spec.optimizer.kind == "adaptive_noisy_gd" and spec.optimizer.lr == "auto":
        _need(a, "smoothness")
        filled["optimizer"]["lr"] = 1 / (2 * a.smoothness)
    placeholder = {**filled, "optimizer": {**filled["optimizer"], "steps": 1}}
    partial = spec.resolved(n_private=n_private, noise_multiplier=1.0, filled=placeholder)
    accountant = accountant_for(partial)
    z = spec.mechanism.noise_multiplier
    if z == "auto":
        z = accountant.calibrate(lambda m: charged_event(partial, m), epsilon, float(delta))
    z = float(z)
    plan = plan_for(partial, n, d, z)
    steps = plan.max_steps if isinstance(plan, AdaptivePlan) else plan.releases
    if spec.optimizer.steps not in ("auto", steps):
        raise ValueError(f"optimizer.steps: {spec.optimizer.steps}, but the plan has {steps} (its most releases); "
                         "leave steps auto")
    filled["optimizer"]["steps"] = steps
    final = spec.resolved(n_private=n_private, noise_multiplier=z, filled=filled)
    if not isinstance(plan, AdaptivePlan):  # the plan composes to its charge: checked, not assumed
        planned = event_rho(plan_event(plan))
        if not math.isclose(planned, rho_of(z), rel_tol=1e-9):
            raise ArithmeticError(f"{spec.optimizer.kind}: the plan costs rho {planned}, not the {rho_of(z)} charged")
    eps = accountant.epsilon(charged_event(final, z), float(final.privacy.delta))
    if eps > epsilon * (1 + 1e-9):
        raise ValueError(f"mechanism.noise_multiplier: {z} gives epsilon {eps:.4g} > privacy.epsilon {epsilon}; "
                         "use noise_multiplier: auto or raise it")
    return final, 1.0, eps


def is_kl(spec) -> bool:
    return spec.optimizer.kind in KL_KINDS
