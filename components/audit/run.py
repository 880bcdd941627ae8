"""One audited run: canaries in, privzo's own loop (its sampler, mechanism and accountant), guesses out,
and a lower bound on epsilon beside the epsilon the run claims.

The run audited is the spec's own: its model and initialisation (and public warm start), estimator,
mechanism, clip, noise multiplier calibrated by its accountant, sampler and number of steps. Only its
private rows change: they are the canaries each included with probability 1/2 (plus, optionally, the
public rows as an always-present background). The spec's private rows are never read by the run, so an
audit spends none of their budget and can log what it likes about its own canaries.

Under add/remove neighbours the sampler's rate is expected_batch_size / data.declared_private_rows, the
spec's public constant, and stays what the claim was computed with: the accountant's guarantee holds for
any one row added to or removed from any dataset, whatever its size, so the canaries are audited against
exactly the claimed (epsilon, delta) and the declared count is left as the spec gives it. Under replace-one
every canary slot always holds a row (the canary or its alternate), so the row count is the same whatever
is included and is what the run is planned with.

The theory families (O2NC's oracles over tree aggregation, scheduled or one-shot Gaussians; the KL paper's
optimizers over planned or filtered Gaussians) are planned through their family exactly as their runs are
(``resolve_privacy`` with the model's dimension), and their plans read the row count: under replace-one the
audit's run has the spec's N private rows, the canary slots and rows the auditor fills (``_fillers``).
Their d-dimensional releases are scored by ``components.audit.vectors.VectorProbe``.

``audit_many`` (``components.audit.many_runs``) is the classic alternative: many runs with one canary each,
a bound from Clopper-Pearson on the errors.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch
from scipy import special

from components import builders, models
from components.audit.bounds import many_runs_ceiling, one_run_ceiling, one_run_epsilon
from components.audit.canaries import (
    CanarySet,
    Probe,
    draw_canaries,
    final_losses,
    gradient_norms,
    opposite_alternates,
    pick,
    scale_for_clip,
    scaled,
)
from components.audit.guessing import count_correct, guesses, pick_guess_count, split_guess
from components.audit.vectors import VectorProbe
from components.data.split import Part, SplitData
from components.randomness import private_generator, public_seed
from components.registry import SOURCES
from specs.traits import reads_text, DENSE, ESTIMATORS, KL, MODELS, SAMPLERS, STANDARD, family_of, kinds

STREAM_AUDIT = 20  # public stream of the canaries (no other stream uses 20)

BACKGROUNDS = ("none", "public")
# dense releases (DP-SGD, DPGD-0th, GEP) add the m x m x d overlap of the canaries' gradients every
# m / DENSE_OVERLAP_SLOTS steps: about as much work again as the templates themselves
DENSE_OVERLAP_SLOTS = 50

# how far past the clip a canary's per-example value is pushed: a Gaussian direction's finite difference
# <g, u> ~ N(0, |g|^2) falls inside [-C, C] with probability ~0.8 C / |g|, under 1% at |g| = 100 C
CLIP_MARGIN = 100.0

SINGLE_CANARY_POOL = 64


@dataclass(frozen=True)
class ThreatModelResult:
    threat: str  # white_box | black_box
    epsilon_lower: float
    guesses: int
    correct: int
    # (mean score of included - mean of excluded) / pooled sd: how far apart the auditor's scores put the two
    # groups (a diagnostic computed after the guesses, from the truth; the bound does not use it)
    separation: float = 0.0
    canaries_bounded: int = 0  # canaries the bound counts (half of them when the guess count came from a split)


@dataclass(frozen=True)
class AuditResult:
    spec_name: str
    estimator: str
    claimed_epsilon: float
    target_epsilon: float
    delta: float
    noise_multiplier: float
    noise_scale: float
    steps: int
    sampling: str
    accountant: str
    neighboring: str
    canaries: int
    confidence: float
    background: str
    background_rows: int
    canary_scale: float
    share_at_clip: float
    white_box: ThreatModelResult
    black_box: ThreatModelResult
    seconds: float
    threads: int
    notes: List[str] = field(default_factory=list)
    # per canary: included or not, and each threat model's scores (the audit's own data, no private row)
    included: Optional[np.ndarray] = field(default=None, repr=False, compare=False)
    white_box_scores: Optional[np.ndarray] = field(default=None, repr=False, compare=False)
    black_box_scores: Optional[np.ndarray] = field(default=None, repr=False, compare=False)
    # one-run: one training run, ``canaries`` slots; many-runs: ``runs`` runs of one canary each (then
    # ``included`` and the scores are per run)
    method: str = "one-run"
    runs: int = 1
    filled_rows: int = 0  # of the background rows, those the audit filled to the spec's N (theory families)
    person_rows: int = 1  # a person-level spec: the rows of each canary person

    @property
    def epsilon_lower(self) -> float:
        return max(self.white_box.epsilon_lower, self.black_box.epsilon_lower)

    @property
    def ceiling(self) -> float:
        """The largest bound this audit's design can give (every guess right): it cannot refute claims above."""
        if self.method == "many-runs":
            return many_runs_ceiling(self.runs, self.delta, self.confidence)
        return one_run_ceiling(self.canaries, self.delta, self.confidence)

    @property
    def method_sentence(self) -> str:
        if self.method == "many-runs":
            return (f"{self.runs} training runs with one canary, which half of them include, in a random order; "
                    "Clopper-Pearson bounds on the false positive and false negative rates, each at half the "
                    "level (Jagielski, Ullman and Oprea 2020)")
        return (f"one training run with {self.canaries} canaries, each included independently with probability "
                "1/2 (Steinke, Nasr and Jagielski 2023, Corollary 5.4, its delta term included)")

    @property
    def exceeds_claim(self) -> bool:
        """The audit refutes the claim: some threat model's lower bound is above the claimed epsilon."""
        return self.epsilon_lower > self.claimed_epsilon


def default_canaries(spec, planned=None, rows: Optional[int] = None) -> int:
    """How many canaries by default. A d-dimensional release (DP-SGD, DPGD-0th, GEP, O2NC's oracles, the KL
    paper's gradients) has room for many canaries whose vectors barely overlap: 1000, and under replace-one
    in the theory families at most a quarter of the spec's ``rows`` (their plan is for those rows; the audit
    fills the others). A step of q scalar releases (DPZero, PAZO) carries every sampled canary in the same q
    numbers, so each canary's score also holds the others' sampled +-C: with m canaries in the run, the
    score of one separates in from out by about sqrt(2 rate T q / m) standard deviations even with no noise
    at all. m = rate T q / 4 keeps that near 3 (between 100 and 1000). ``planned``: resolve_privacy's answer
    for ``spec``, if already at hand."""
    if family_of(spec) != STANDARD:
        return 1000 if rows is None else max(4, min(1000, rows // 4))
    if ESTIMATORS[spec.estimator.kind].release == DENSE or spec.privacy.neighboring == "replace_one":
        return 1000
    resolved, rate, _ = planned if planned is not None else builders.resolve_privacy(spec, None)
    queries = builders.build_estimator(resolved).queries_per_step
    return int(min(1000, max(100, round(rate * resolved.optimizer.steps * queries / 4))))


def with_epsilon(spec, epsilon: float):
    """``spec`` with privacy.epsilon set (its noise then calibrated for it, as the spec's own run would)."""
    if spec.privacy is None:
        raise ValueError("--epsilon: the spec has no privacy section (mechanism none); there is no epsilon to set")
    from specs import spec_from_dict

    data = spec.model_dump(mode="json")
    data["privacy"]["epsilon"] = epsilon
    return spec_from_dict(data)


def _with_noise_scale(spec, scale: float):
    """``spec`` (resolved) with every noise multiplier of its mechanism times ``scale`` (the scheduled
    Gaussians' two), the rest of its plan as it was."""
    data = spec.model_dump(mode="json")
    mech = data["mechanism"]
    mech["noise_multiplier"] = float(mech["noise_multiplier"]) * scale
    if mech.get("difference_noise_multiplier") is not None:
        mech["difference_noise_multiplier"] = float(mech["difference_noise_multiplier"]) * scale
    return type(spec).model_validate(data)


class NoiseOff:
    """A broken mechanism for testing the audit: the clip and every accounting fact of the real one, and
    releases of the clipped sums with no noise at all. A running-sum mechanism (tree, scheduled Gaussians)
    still runs, so that its position and sensitivity move on as the door expects, and its release is
    replaced by the plain running sum of the increments, restarted every period; the KL paper's full-batch
    mechanism releases the plain mean and norm, and its exponential mechanism picks the best score."""

    def __init__(self, inner):
        self._inner = inner
        self._sum = None
        self._position = 0

    def release_scalars(self, sums):
        return sums.detach().to(device="cpu", dtype=torch.float64)

    def release_vector(self, tensors):
        return list(tensors)

    def release_embedded(self, embedding, residual, residual_clip, embedding_share):
        return embedding.detach().to(device="cpu", dtype=torch.float64), list(residual)

    def release_running_sum(self, increment):
        self._inner.release_running_sum(increment)  # its noisy release is dropped
        increment = [t.detach().to(torch.float64) for t in increment]
        self._sum = increment if self._position == 0 else [s + t for s, t in zip(self._sum, increment)]
        self._position += 1
        out = [t.clone() for t in self._sum]
        if self._position == self._inner.period:
            self._position, self._sum = 0, None
        return out

    def reset(self) -> None:
        self._inner.reset()
        self._position, self._sum = 0, None

    def release_mean(self, sums, std):
        return self._inner.unnoised_mean(sums)

    def release_norm(self, sums, std):
        return math.sqrt(sum(float(t.pow(2).sum()) for t in self._inner.unnoised_mean(sums)))

    def release_choice(self, scores, scale):
        return int(np.argmin(np.asarray(scores, dtype=np.float64)))  # P(t) ~ exp(-scale s_t) with no noise

    def __getattr__(self, name):
        return getattr(self._inner, name)


class ScaledNoise:
    """A broken KL-family mechanism: every release's noise multiplied by ``scale`` while the optimizer's plan
    and the privacy filter keep charging the stds they asked for. (The Gaussian, tree and scheduled
    mechanisms are broken through their spec's noise multipliers instead: their noise is drawn inside.)"""

    def __init__(self, inner, scale: float):
        self._inner = inner
        self._scale = float(scale)

    def release_mean(self, sums, std):
        return self._inner.release_mean(sums, std * self._scale)

    def release_norm(self, sums, std):
        return self._inner.release_norm(sums, std * self._scale)

    def release_choice(self, scores, scale):
        # argmax(-scale s_t + c G_t) = argmax(-(scale / c) s_t + G_t): Gumbel noise times c
        return self._inner.release_choice(scores, scale / self._scale)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def audit_problem(spec) -> Optional[str]:
    """Why this spec cannot be audited, in one line starting with the field that is the reason, or None."""
    if spec.mechanism.kind == "none":
        return "mechanism.kind: none claims no privacy; there is nothing to audit (use a private mechanism)"
    source = spec.data.source
    file_text = reads_text(source)
    if source.kind in ("text", "completions") or file_text or MODELS[spec.model.kind].reads == "tokens":
        return (f"data.source: the audit writes its canaries as feature vectors; token-id rows (text sources, "
                f"model.kind {', '.join(kinds(MODELS, reads='tokens'))}) are not supported yet")
    return None


def _local(spec):
    """The spec run in-process: the audit reads the replica's parameters at every step (white-box)."""
    data = spec.model_dump(mode="json")
    data["execution"]["backend"] = "local"
    data["execution"]["prefetch_directions"] = False  # the probe's own forwards share the direction cache
    return type(spec).model_validate(data)


def _direction_factor(spec, built) -> float:
    """|<g, u>| / |g| for the estimator's directions: 1 for Gaussian and Rademacher ones (E<g,u>^2 = |g|^2),
    radius / sqrt(d) on a sphere of that radius."""
    directions = built.loop.backend.directions
    if getattr(spec.estimator, "directions", "gaussian") == "sphere" or spec.estimator.kind == "pazo_m":
        return directions.radius / math.sqrt(directions.dim)
    return 1.0


def bound_from_scores(threat: str, scores: np.ndarray, included: np.ndarray, delta: float, confidence: float,
                      guess_count: Optional[int] = None, method: str = "mixture", seed: int = 0) -> ThreatModelResult:
    """Guess on the canaries with the most extreme scores and turn the count of correct guesses into the
    one-run bound; how many guesses: ``guess_count``, or chosen by ``method`` (components.audit.guessing:
    mixture, probit for standardized scores, split)."""
    m = len(scores)
    if guess_count is not None or method in ("mixture", "probit"):
        posterior = special.ndtr(scores) if method == "probit" else None
        r = pick_guess_count(scores, delta, confidence, guess_count, posterior)
        v = count_correct(guesses(scores, r), included)
        used, eps = m, one_run_epsilon(m, r, v, delta, confidence)
    elif method == "split":
        used, r, v, eps = split_guess(scores, included, delta, confidence, seed)
    else:
        raise ValueError(f"guess method: unknown {method!r}; allowed: mixture, probit, split")
    return ThreatModelResult(threat, eps, r, v, separation(scores, included), used)


def separation(scores: np.ndarray, included: np.ndarray) -> float:
    inc = np.asarray(included, dtype=bool)
    a, b = scores[inc], scores[~inc]
    if len(a) < 2 or len(b) < 2:
        return 0.0
    pooled = math.sqrt(0.5 * (a.var(ddof=1) + b.var(ddof=1)))
    gap = float(a.mean() - b.mean())
    if pooled <= 1e-9 * abs(gap):  # scores that are one value in and another out (rounding aside)
        return math.copysign(math.inf, gap)
    return gap / pooled if pooled > 0 else 0.0


def _audit_data(data: SplitData, rows_x: np.ndarray, rows_y: np.ndarray,
                persons: Optional[np.ndarray] = None) -> SplitData:
    fps = [f"{i:064x}" for i in range(len(rows_y))]  # placeholders in the fingerprints' form: nothing reads them
    private = Part(rows_x.astype(np.float32, copy=False), rows_y.astype(np.int64, copy=False), fps, persons)
    return SplitData(data.public, private, data.test, data.n_classes, data.n_features, data.layout,
                     preprocessing=data.preprocessing)


def check_arguments(spec, canaries, confidence, background, noise_scale) -> None:
    problem = audit_problem(spec)
    if problem:
        raise ValueError(problem)
    if canaries is not None and canaries < 4:
        raise ValueError(f"--canaries: {canaries} must be at least 4")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"--confidence: {confidence} must be strictly between 0 and 1 (e.g. 0.95)")
    if background not in BACKGROUNDS:
        raise ValueError(f"--background: unknown {background!r}; allowed: {', '.join(BACKGROUNDS)}")
    if not (noise_scale >= 0.0 and math.isfinite(noise_scale)):
        raise ValueError(f"--noise-scale: {noise_scale} must be a finite number >= 0")


@dataclass
class _Setup:
    """What every training run of one audit shares: the spec run in-process, its resolved plan and claim, the
    canary slots scaled past the clip at x_0, and the background rows (the theory families' fillers
    among them)."""

    spec: object
    resolved: object
    claimed: float
    slots: CanarySet
    scale: float
    bg_x: np.ndarray
    bg_y: np.ndarray
    canary_seed: int
    notes: List[str]
    theory: bool = False  # O2NC's or the KL paper's run: d-dimensional per-example releases (VectorProbe)
    filled: int = 0  # of the background, the rows the audit filled to the spec's N (theory families)
    # a person-level spec: each canary is a person with this many rows (copies of the canary row, which push
    # every release the same way: the worst case for a person's sum); 1 at event level
    person_rows: int = 1


def _fillers(spec, data: SplitData, count: int, seed: int):
    """``count`` rows the auditor writes besides its canaries, so that a theory family's run has the N rows
    its plan is for: a synthetic problem's own simulator with the audit's seed (rows like the spec's, none
    of them its), else random unit feature vectors with random labels (the canaries' draw, unscaled)."""
    source = spec.data.source
    if count <= 0:
        return data.public.features[:0], data.public.labels[:0]
    if source.kind == "synthetic":
        drawn = source.model_copy(update={"data_seed": seed % 2**31, "rows": max(int(source.rows), count)})
        table, _ = SOURCES[source.kind](drawn)
        return table.features[:count].astype(np.float32), table.labels[:count].astype(np.int64)
    unit = draw_canaries(count, data.n_features, data.n_classes, seed)
    return unit.features, unit.labels


def _largest_clip(resolved) -> float:
    """The largest per-example bound the mechanism's clips set (a start's or a difference's)."""
    mech = resolved.mechanism
    return max(float(mech.clip), float(getattr(mech, "difference_clip", None) or 0.0))


def audit_setup(spec, data: SplitData, canaries: Optional[int], background: str, seed: Optional[int]) -> _Setup:
    spec = _local(spec)
    replace_one = spec.privacy.neighboring == "replace_one"
    theory = family_of(spec) != STANDARD
    # the theory families' plans read the model's dimension, as a real run's does (builders.plan)
    dimension = builders.model_dimension(spec, data.n_features, data.n_classes) if theory else None
    # ...and under replace-one the spec's own row count N (public there): the audit's run has N rows, the
    # canary slots and rows it fills
    rows = len(data.private) if theory and replace_one else None
    given = canaries is not None
    if canaries is None:  # the default needs the add/remove plan, which needs no rows: planned once
        planned = None if replace_one else builders.resolve_privacy(spec, None, dimension)
        canaries = default_canaries(spec, planned, rows)
    else:
        planned = None
    if rows is not None and canaries > rows // 2:
        # the theory families' plan is for the spec's N rows: the canary slots and the rows the audit fills
        field = "--canaries" if given else "data"
        raise ValueError(f"{field}: {canaries} canaries are more than half of the spec's {rows} private rows, which "
                         f"its plan is for (the audit fills the others); give more rows, or at most {rows // 2} "
                         "canaries (or --runs, one canary a run)")
    notes = (["privacy.insecure_deterministic: the run's noise and batches come from the public seed"]
             if spec.privacy.insecure_deterministic else [])
    canary_seed = public_seed(spec.seed if seed is None else seed, STREAM_AUDIT)
    # a lone canary (many runs) is the most extreme of a public draw of SINGLE_CANARY_POOL, picked at x_0
    # below: a random one is as likely as not already classified right, its loss and gradient then 0
    drawn = SINGLE_CANARY_POOL if canaries == 1 else canaries
    slots = draw_canaries(drawn, data.n_features, data.n_classes, canary_seed, replace_one=replace_one)
    if background == "public":
        bg_x, bg_y = data.public.features, data.public.labels
    else:
        bg_x, bg_y = data.public.features[:0], data.public.labels[:0]
    filled = 0
    if rows is not None:
        bg_x, bg_y = bg_x[:rows - canaries], bg_y[:rows - canaries]
        filled = rows - canaries - len(bg_y)
        fx, fy = _fillers(spec, data, filled, public_seed(canary_seed, 2))
        bg_x = np.concatenate([bg_x.astype(np.float32), fx.astype(np.float32)])
        bg_y = np.concatenate([bg_y.astype(np.int64), fy.astype(np.int64)])
    # the claim audited: the spec's own plan. Under add/remove it needs no row count at all; under
    # replace-one every slot always holds a row, so the count is the slots plus the background, whatever
    # is included
    count = canaries + len(bg_y) if replace_one else None
    if planned is not None:
        resolved, _rate, claimed = planned
    else:
        resolved, _rate, claimed = builders.resolve_privacy(spec, count, dimension)

    # x_0: the public initialisation after any public warm start (no private row involved), where the
    # canaries' scale is set (a loop over the unscaled slots, never run: only its model is used)
    if theory:  # as many rows as the run will have: the single pass and the KL plans read the count
        unscaled = _audit_data(data, np.concatenate([bg_x, slots.features[:canaries]]),
                               np.concatenate([bg_y, slots.labels[:canaries]]))
    else:
        unscaled = _audit_data(data, slots.features, slots.labels)
    probe_built = builders.build_loop(resolved, unscaled, noise_generator=torch.Generator().manual_seed(0),
                                      sampling_generator=torch.Generator().manual_seed(0))
    builders.public_warm_start(resolved, probe_built)
    params = probe_built.loop.backend.directions.params
    if theory:
        # a per-example vector (or each coefficient <g, u>, |u| = sqrt(d)) far past every clip of the run
        target = CLIP_MARGIN * _largest_clip(resolved)
    else:
        target = CLIP_MARGIN * float(resolved.mechanism.clip) / _direction_factor(spec, probe_built)
    scale = scale_for_clip(probe_built.model, params, models.per_example_loss, slots, target, probe_built.device)
    slots = scaled(slots, scale)
    if theory and replace_one:
        slots = opposite_alternates(probe_built.model, params, models.per_example_loss, slots, probe_built.device)
    if canaries == 1:
        norms = gradient_norms(probe_built.model, params, models.per_example_loss, slots.features, slots.labels,
                               probe_built.device)
        slots = pick(slots, int(np.argmax(np.nan_to_num(norms, nan=-1.0))))
    return _Setup(spec, resolved, float(claimed), slots, float(scale), bg_x, bg_y, canary_seed, notes, theory,
                  filled)


@dataclass
class _Trained:
    """One training run on the canaries: each slot's white-box and black-box scores."""

    white_scores: np.ndarray
    black_scores: np.ndarray
    share_at_clip: float
    sampling: str


def _rows(setup: _Setup, included: np.ndarray):
    """The run's rows: the background (and fillers), then each slot's canary if included, else its alternate
    (replace-one) or nothing (add/remove); and, for a person-level spec, each row's person: a background row
    is a person of its own, an included canary a person of ``person_rows`` rows."""
    slots = setup.slots
    if slots.replace_one:
        cx = np.where(included[:, None], slots.features, slots.alternate_features)
        cy = np.where(included, slots.labels, slots.alternate_labels)
    else:
        cx, cy = slots.features[included], slots.labels[included]
    persons = None
    if setup.spec.person_level:
        k = setup.person_rows
        cx, cy = np.repeat(cx, k, axis=0), np.repeat(cy, k)
        persons = np.concatenate([np.arange(len(setup.bg_y)), len(setup.bg_y) + np.arange(len(cy)) // k])
    rows_x = np.concatenate([setup.bg_x, cx]) if len(setup.bg_y) else cx
    rows_y = np.concatenate([setup.bg_y, cy]) if len(setup.bg_y) else cy
    return rows_x, rows_y, persons


def train_with_canaries(setup: _Setup, data: SplitData, included: np.ndarray, noise_scale: float,
           noise_generator: Optional[torch.Generator], sampling_generator: Optional[torch.Generator],
           on_step=None, clip_rows_alone: bool = False) -> _Trained:
    if setup.theory:
        return _train_vectors(setup, data, included, noise_scale, noise_generator, sampling_generator, on_step)
    slots, resolved = setup.slots, setup.resolved
    replace_one = slots.replace_one
    audit_data = _audit_data(data, *_rows(setup, included))

    sigma = float(resolved.mechanism.noise_multiplier)
    clip = float(resolved.mechanism.clip)
    # a deliberately broken run draws noise of multiplier sigma * noise_scale; the claim stays the one
    # calibrated for sigma
    run_spec = resolved if noise_scale in (0.0, 1.0) else _with_noise_scale(resolved, noise_scale)
    built = builders.build_loop(run_spec, audit_data, noise_generator=noise_generator,
                                sampling_generator=sampling_generator)
    builders.public_warm_start(run_spec, built)
    loop = built.loop
    if noise_scale == 0.0:
        loop.mechanism = NoiseOff(loop.mechanism)
    if clip_rows_alone:  # a deliberately broken person-level run: persons sampled, each row clipped alone
        loop.backend._persons = None
    device = built.device
    bx = torch.as_tensor(setup.bg_x, device=device)
    by = torch.as_tensor(setup.bg_y, device=device)
    # the noise the claim promises per released coordinate (the auditor's model of a release, public)
    claimed_std = math.sqrt(loop.estimator.queries_per_step) * sigma * clip * (2.0 if replace_one else 1.0)
    probe = Probe(slots, bx, by, loop.sampler.rate, models.per_example_loss, device, noise_std=claimed_std,
                  dense_overlap_every=max(1, round(len(slots) / DENSE_OVERLAP_SLOTS)), copies=setup.person_rows)
    probe.attach(loop)
    loss_start = final_losses(built.model, models.per_example_loss, slots, device)
    loop.run(resolved.optimizer.steps, on_step=on_step)
    loss_end = final_losses(built.model, models.per_example_loss, slots, device)
    # black-box: only the final model (and the public x_0): a canary whose loss fell the most was trained on
    return _Trained(probe.decorrelated_scores(), loss_start - loss_end, probe.share_at_clip, loop.sampler.describe())


def _release_model(kind: str, mechanism):
    """How VectorProbe takes the mechanism's releases apart, and each one's noise std (the mechanism's own:
    the claim's, or all of them scaled alike in a broken run, which leaves their ratios, all that the
    scores use). The KL paper's mechanism states each release's std with the release."""
    if kind == "tree_aggregation":
        return "tree", (lambda position: mechanism.std)
    if kind == "scheduled_gaussian":
        return "differences", (lambda position: mechanism.stds[0 if position == 1 else 1])
    if kind == "gaussian":
        return None, (lambda position: mechanism.std)
    return None, None


def _probed_loop(setup: _Setup, data: SplitData, included: np.ndarray, noise_scale: float,
                 noise_generator: Optional[torch.Generator], sampling_generator: Optional[torch.Generator]):
    """The theory families' run of the spec on the rows (O2NC's oracles, the KL paper's gradients), its
    mechanism broken as ``noise_scale`` asks, a VectorProbe attached: (built, probe)."""
    slots, resolved = setup.slots, setup.resolved
    audit_data = _audit_data(data, *_rows(setup, included))
    kl = family_of(resolved) == KL
    # a broken run: the tree's, the scheduled and the one-shot Gaussians' multipliers scaled in the spec (the
    # rest of the plan as it was); the KL plan derives its releases from its multiplier, so there the
    # mechanism scales each release's noise instead. The claim stays the one calibrated for sigma.
    scaled_spec = noise_scale not in (0.0, 1.0) and not kl
    run_spec = _with_noise_scale(resolved, noise_scale) if scaled_spec else resolved
    built = builders.build_loop(run_spec, audit_data, noise_generator=noise_generator,
                                sampling_generator=sampling_generator)
    builders.public_warm_start(run_spec, built)
    loop = built.loop
    mechanism = loop.mechanism
    if noise_scale == 0.0:
        loop.mechanism = NoiseOff(mechanism)
    elif kl and noise_scale != 1.0:
        loop.mechanism = ScaledNoise(mechanism, noise_scale)
    running, release_std = _release_model(resolved.mechanism.kind, mechanism)
    if slots.replace_one and not SAMPLERS[resolved.sampling.kind].subsampled:
        # which rows a batch holds is public (a single pass's order comes from the seed; a full batch holds
        # all), and a slot's row is there whatever is included: the probe reads the batches
        nb = len(setup.bg_y)

        def both(x, y):  # every row as the backend holds it (float32 features), a slot's row as given
            return (np.concatenate([setup.bg_x, x]).astype(np.float32),
                    np.concatenate([setup.bg_y, y]).astype(np.int64))

        where = dict(rows_in=both(slots.features, slots.labels),
                     rows_out=both(slots.alternate_features, slots.alternate_labels),
                     slot_of_row=np.concatenate([np.full(nb, -1), np.arange(len(slots))]))
    else:
        where = dict(background=(setup.bg_x.astype(np.float32), setup.bg_y.astype(np.int64)),
                     rate=loop.sampler.rate)
    probe = VectorProbe(slots, models.per_example_loss, built.device, running=running, release_std=release_std,
                        **where)
    probe.attach(loop)
    return built, probe


def _train_vectors(setup: _Setup, data: SplitData, included: np.ndarray, noise_scale: float,
                   noise_generator: Optional[torch.Generator], sampling_generator: Optional[torch.Generator],
                   on_step=None) -> _Trained:
    """``train_with_canaries`` for the theory families: the spec's loop on the rows, scored by VectorProbe (standardized
    posterior estimates, see VectorProbe.standardized_scores)."""
    built, probe = _probed_loop(setup, data, included, noise_scale, noise_generator, sampling_generator)
    slots, device = setup.slots, built.device
    loss_start = final_losses(built.model, models.per_example_loss, slots, device)
    built.loop.run(setup.resolved.optimizer.steps, on_step=on_step)
    loss_end = final_losses(built.model, models.per_example_loss, slots, device)
    return _Trained(probe.standardized_scores(), loss_start - loss_end, probe.share_at_clip,
                    built.loop.sampler.describe())


def audit_result(setup: _Setup, trained: _Trained, *, canaries: int, confidence: float, background: str,
            noise_scale: float, white: ThreatModelResult, black: ThreatModelResult, seconds: float,
            included: np.ndarray, white_scores: np.ndarray, black_scores: np.ndarray, method: str = "one-run",
            runs: int = 1, share_at_clip: Optional[float] = None) -> AuditResult:
    spec, resolved = setup.spec, setup.resolved
    return AuditResult(
        spec_name=spec.name, estimator=spec.estimator.kind, claimed_epsilon=setup.claimed,
        target_epsilon=float(spec.privacy.epsilon), delta=float(resolved.privacy.delta),
        noise_multiplier=float(resolved.mechanism.noise_multiplier), noise_scale=float(noise_scale),
        steps=int(resolved.optimizer.steps), sampling=trained.sampling, accountant=resolved.privacy.accountant,
        neighboring=resolved.privacy.neighboring, canaries=canaries, confidence=confidence, background=background,
        background_rows=int(len(setup.bg_y)), canary_scale=setup.scale,
        share_at_clip=trained.share_at_clip if share_at_clip is None else share_at_clip,
        white_box=white, black_box=black, seconds=seconds, threads=torch.get_num_threads(),
        notes=setup.notes, included=included, white_box_scores=white_scores, black_box_scores=black_scores,
        method=method, runs=runs, filled_rows=setup.filled, person_rows=setup.person_rows)


def audit(spec, data: SplitData, *, canaries: Optional[int] = None, confidence: float = 0.95,
          background: str = "none",
          noise_scale: float = 1.0, guess_count: Optional[int] = None, seed: Optional[int] = None,
          inclusion_generator: Optional[torch.Generator] = None,
          noise_generator: Optional[torch.Generator] = None,
          sampling_generator: Optional[torch.Generator] = None,
          on_step=None, person_rows: Optional[int] = None, clip_rows_alone: bool = False) -> AuditResult:
    """Audit ``spec`` (unresolved, as loaded) on ``canaries`` canary slots in one training run; see the
    module docstring.

    A person-level spec (data.blocks.person) is audited on canary persons of ``person_rows`` rows (default
    2), sampled and clipped as the run samples and clips persons; the claim is for adding or removing one
    such person. ``clip_rows_alone`` (tests only) breaks the run as event-level clipping would, each row
    clipped alone, which a person of k rows moves by k times the clip.

    ``noise_scale`` multiplies the mechanism's noise while the accountant keeps the calibrated claim: 1
    is the mechanism as built, 0 switches the noise off, 0.1 is sigma/10. Anything but 1 is a deliberately
    broken run, for checking that the audit catches it. ``data``: the spec's split; only its public rows
    (and, for ``background: public``, those again as always-present private rows) reach the run.
    Generators: inclusion of the canaries, DP noise and batches; OS entropy unless injected (tests)."""
    check_arguments(spec, canaries, confidence, background, noise_scale)
    start = time.perf_counter()
    setup = audit_setup(spec, data, canaries, background, seed)
    setup.person_rows = person_rows_of(spec, person_rows)
    canaries = len(setup.slots)
    gen = inclusion_generator if inclusion_generator is not None else private_generator()
    included = (torch.rand(canaries, generator=gen, dtype=torch.float64) < 0.5).numpy()
    trained = train_with_canaries(setup, data, included, noise_scale, noise_generator, sampling_generator, on_step,
                     clip_rows_alone)

    delta = float(setup.resolved.privacy.delta)
    # the theory families' white-box scores are standardized posterior estimates (VectorProbe)
    white = bound_from_scores("white_box", trained.white_scores, included, delta, confidence, guess_count,
                              method="probit" if setup.theory else "mixture")
    black = bound_from_scores("black_box", trained.black_scores, included, delta, confidence, guess_count,
                              method="split", seed=public_seed(setup.canary_seed, 1))
    return audit_result(setup, trained, canaries=canaries, confidence=confidence, background=background,
                   noise_scale=noise_scale, white=white, black=black, seconds=time.perf_counter() - start,
                   included=included, white_scores=trained.white_scores, black_scores=trained.black_scores)


def person_rows_of(spec, person_rows: Optional[int]) -> int:
    if not spec.person_level:
        if person_rows not in (None, 1):
            raise ValueError("--person-rows: the spec is event level (no data.blocks.person); its canaries are rows")
        return 1
    if person_rows is None:
        return 2
    if person_rows < 1:
        raise ValueError(f"--person-rows: {person_rows} must be at least 1")
    return int(person_rows)
