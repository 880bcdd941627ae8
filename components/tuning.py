"""privzo tune below the flow: the law of K (how many candidates run) and its draw, each candidate's spec,
and the search's privacy event.

Papernot & Steinke ("Hyperparameter tuning with Renyi differential privacy", ICLR 2022): run a mechanism Q a
random number K of times and release only the best output; if Q is (lambda, eps)-RDP, the whole is RDP at a
small multiple of Q's cost (dp-accounting's RepeatAndSelectDpEvent composes it in the RDP accountant). Here Q
is one candidate: draw a setting uniformly from the public grid, train this spec with it, score it on rows
that are not private. The bound needs three things privzo keeps:
- K and the draws come from the operating system's randomness and are never released (a known K would make
  the release the best of K fixed runs, which costs up to K times one);
- every candidate is the same mechanism: its privacy event is the same whatever its setting (checked here;
  a setting that changes the steps, the sampling or the releases is refused);
- only the winner's output is released: a losing candidate leaves no metric, model or log line.
"""
from __future__ import annotations

import math
import secrets
from typing import Callable, Dict, List, Optional, Tuple

import dp_accounting
from dp_accounting import dp_event

from specs.sections.tune import RepeatSpec, TuneSpec, Value

# the fields a search may not vary: they are the search's own (calibrated, or the guarantee itself)
_NOT_SEARCHED = ("mechanism.noise_multiplier", "mechanism.kind", "privacy")


class RepeatLaw:
    """K's distribution: Poisson(mean) (K = 0 possible: nothing is released), or the truncated negative
    binomial of shape eta (geometric eta = 1, logarithmic eta = 0) on K >= 1, its gamma solved from the mean."""

    def __init__(self, repeat: RepeatSpec):
        self.repeat = repeat
        self.shape = repeat.accounting_shape
        self.mean = float(repeat.mean)
        self.gamma = None if math.isinf(self.shape) else _gamma(self.shape, self.mean)

    def pmf(self, k: int) -> float:
        if math.isinf(self.shape):
            return math.exp(-self.mean + k * math.log(self.mean) - math.lgamma(k + 1)) if k >= 0 else 0.0
        if k < 1:
            return 0.0
        p = self._first()
        for j in range(1, k):  # p(j + 1) / p(j) = (1 - gamma) (j + eta) / (j + 1)
            p *= (1 - self.gamma) * (j + self.shape) / (j + 1)
        return p

    def _first(self) -> float:
        g, eta = self.gamma, self.shape
        if eta == 0:  # logarithmic
            return (1 - g) / math.log(1 / g)
        return eta * (1 - g) / (g ** -eta - 1)

    def draw(self, uniform: Callable[[], float]) -> int:
        """K by inversion of the CDF at ``uniform()`` (a U(0, 1) draw: the OS's randomness in a search)."""
        u = uniform()
        k = 0 if math.isinf(self.shape) else 1
        p = self.pmf(k)
        cdf = p
        while cdf < u and p > 0:
            ratio = (self.mean / (k + 1)) if math.isinf(self.shape) else \
                (1 - self.gamma) * (k + self.shape) / (k + 1)
            k += 1
            p *= ratio
            cdf += p
        return k

    def tail(self, k: int) -> float:
        """P(K > k)."""
        return max(0.0, 1.0 - sum(self.pmf(j) for j in range(0, k + 1)))

    def quantile(self, q: float) -> int:
        """The smallest k with P(K <= k) >= q."""
        k, cdf = 0, 0.0
        while True:
            cdf += self.pmf(k)
            if cdf >= q or k > 10_000_000:
                return k
            k += 1

    def describe(self) -> str:
        r = self.repeat
        if r.distribution == "truncated_negative_binomial":
            return f"truncated negative binomial (mean {r.mean:g}, shape {r.shape:g})"
        return f"{r.distribution} (mean {r.mean:g})"


def _gamma(eta: float, mean: float) -> float:
    """The truncated negative binomial's gamma in (0, 1) whose mean is ``mean`` (mean 1: K = 1 always)."""
    def mean_of(g: float) -> float:
        if eta == 0:
            return (1 - g) / (g * math.log(1 / g))
        return eta * (1 - g) / (g * (1 - g ** eta))

    if mean <= 1:
        return 1.0 - 1e-12
    lo, hi = 1e-300, 1.0 - 1e-12  # mean_of falls from infinity to 1 as gamma goes from 0 to 1
    for _ in range(200):
        mid = math.sqrt(lo * hi) if hi / lo > 4 else (lo + hi) / 2
        if mean_of(mid) > mean:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def selection_event(tune: TuneSpec, candidate: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
    """The search's event: the best of K runs of ``candidate``, K drawn from the tune's law. A rehearsal whose
    pick is then trained once (``then: train``) plans that one run: the pick read public rows only."""
    if tune.then == "train":
        return candidate
    return dp_event.RepeatAndSelectDpEvent(candidate, float(tune.candidates.mean),
                                          tune.candidates.accounting_shape)


def candidate_spec(spec, setting: Dict[str, Value]):
    """``spec`` (a RunSpec) with one setting of its search applied and its tune section removed: what one
    candidate runs. A value the field does not take is refused naming the tune's field."""
    from specs.run import RunSpec

    data = spec.model_dump(mode="json")
    data["tune"] = None
    for path, value in setting.items():
        if path.startswith(_NOT_SEARCHED):
            raise ValueError(f"tune.space.{path}: the search does not vary {path} (the noise is calibrated for the "
                             "search, the mechanism and the privacy terms are its guarantee)")
        *parents, last = path.split(".")
        node = data
        for part in parents:
            if not isinstance(node.get(part), dict):
                raise ValueError(f"tune.space.{path}: the spec has no section {part!r} there; give a field's dotted "
                                 "path, e.g. optimizer.lr")
            node = node[part]
        if last not in node:
            raise ValueError(f"tune.space.{path}: {'.'.join(parents) or 'the spec'} has no field {last!r}"
                             + (f"; its fields: {', '.join(sorted(node))}" if node else ""))
        node[last] = value
    try:
        return RunSpec.model_validate(data)
    except Exception as err:  # noqa: BLE001 - pydantic's message, headed by the setting that gave it
        first = str(err).splitlines()
        raise ValueError(f"tune.space: the setting {setting} does not make a valid spec: "
                         f"{' '.join(line.strip() for line in first[1:3]) or first[0]}") from None


def draw_candidates(tune: TuneSpec, rng: Optional[secrets.SystemRandom] = None) -> List[Dict[str, Value]]:
    """The K candidates' settings, each drawn uniformly from the grid; K from the tune's law. The OS's
    randomness: neither K nor the draws can be replayed from anything released."""
    rng = rng or secrets.SystemRandom()
    grid = tune.settings()
    k = RepeatLaw(tune.candidates).draw(rng.random)
    return [grid[rng.randrange(len(grid))] for _ in range(k)]


def same_event_problem(spec, planned: Callable, n_private: Optional[int]) -> Optional[str]:
    """Why the search's candidates are not one mechanism (a setting whose privacy event differs from the
    spec's own), or None. ``planned(spec, n_private, sigma)``: the family's planned event."""
    from components.accountants import event_to_json

    own = event_to_json(planned(candidate_spec(spec, {}), n_private, 1.0))
    for setting in spec.tune.settings():
        other = event_to_json(planned(candidate_spec(spec, setting), n_private, 1.0))
        if other != own:
            return (f"tune.space: the setting {setting} changes a candidate's privacy event (its steps, sampling or "
                    "releases), and the search's bound holds for candidates that are one mechanism; search fields "
                    "that leave it unchanged (e.g. optimizer.lr, mechanism.clip, estimator.mu)")
    return None


def better(score: str, a: float, b: float) -> bool:
    """Whether score ``a`` beats ``b`` (accuracy: higher; loss: lower); NaN never wins."""
    if math.isnan(a):
        return False
    if math.isnan(b):
        return True
    return a > b if score == "accuracy" else a < b


def plan_lines(tune: TuneSpec, candidate_epsilon: float, total_epsilon: float, delta: float) -> List[str]:
    """``privzo validate``'s and ``calibrate``'s tune plan: K's law, one candidate's epsilon, the total."""
    grid = tune.settings()
    fields = ", ".join(tune.space)
    if tune.then == "train":
        return [f"tune: a rehearsal of {len(grid)} settings of {fields} on the public rows ({tune.folds} folds, "
                f"{tune.score.metric} on the {tune.score.split} rows; nothing charged), then its pick trained once on "
                f"the private rows: ({total_epsilon:.4g}, {delta:.3g})-DP, the run's own"]
    law = RepeatLaw(tune.candidates)
    big = max(1, math.ceil(3 * law.mean))
    among = f"the rehearsal's best {min(tune.top, len(grid))} of {len(grid)}" if tune.then == "search" else \
        f"{len(grid)}"
    return [
        *([f"tune: a rehearsal of every setting on the public rows first ({tune.folds} folds; nothing charged)"]
          if tune.then == "search" else []),
        f"tune: the best of K candidates over {among} settings of {fields}, scored by "
        f"{tune.score.metric} on the {tune.score.split} rows; K ~ {law.describe()}, P(K > {big}) = {law.tail(big):.3g}"
        + ("; K = 0 (nothing released) with probability " + f"{law.pmf(0):.3g}" if math.isinf(law.shape) else ""),
        f"tune: each candidate ({candidate_epsilon:.4g}, {delta:.3g})-DP alone; the released winner, the selection "
        f"included, ({total_epsilon:.4g}, {delta:.3g})-DP",
    ]


# the laws `privzo validate` compares at a spec's E[K]: each with its shape, the spec's own added when it is another
COMPARED_LAWS = ({"distribution": "poisson"}, {"distribution": "geometric"}, {"distribution": "logarithmic"},
                 {"distribution": "truncated_negative_binomial", "shape": 0.5})


def sigma_by_law(spec, calibrate: Callable) -> List[Tuple[RepeatLaw, float]]:
    """sigma for ``spec``'s search under each law of K at its E[K] (``calibrate(spec)``: the calibrated sigma of a
    spec), the spec's own law among them: a public function of the spec, so choosing the cheapest costs nothing."""
    tune = spec.tune
    own = tune.candidates.model_dump(exclude_none=True)
    laws = [dict(law, mean=tune.candidates.mean) for law in COMPARED_LAWS
            if not (law["distribution"] == "logarithmic" and tune.candidates.mean <= 1)]
    if {k: v for k, v in own.items() if k != "mean"} not in COMPARED_LAWS:
        laws.append(own)
    out = []
    for law in laws:
        repeat = RepeatSpec(**law)
        varied = spec.model_copy(update={"tune": tune.model_copy(update={"candidates": repeat})})
        out.append((RepeatLaw(repeat), float(calibrate(varied))))
    return out


def law_lines(spec, calibrate: Callable) -> List[str]:
    """``privzo validate``'s comparison: sigma under each law at the spec's E[K] and its tail, the cheapest named."""
    compared = sigma_by_law(spec, calibrate)
    mean = spec.tune.candidates.mean
    big = max(1, math.ceil(3 * mean))
    cheapest = min(compared, key=lambda pair: pair[1])
    own = RepeatLaw(spec.tune.candidates).describe()
    lines = [f"tune: sigma at E[K] = {mean:g} by the law of K (a larger sigma is more noise in every candidate):"]
    for law, sigma in compared:
        lines.append(f"  {law.describe()}: sigma {sigma:.4g}, P(K > {big}) = {law.tail(big):.3g}"
                     + (f", P(K = 0) = {law.pmf(0):.3g} (nothing released, the charge stands)"
                        if math.isinf(law.shape) else "")
                     + ("  <- the spec's" if law.describe() == own else ""))
    lines.append(f"tune: the cheapest at this mean is {cheapest[0].describe()}"
                 + (" (the spec's)" if cheapest[0].describe() == own else
                    f"; the spec's needs {dict((l.describe(), s) for l, s in compared)[own] / cheapest[1]:.3g}x that "
                    "sigma"))
    return lines


def winner(scores: List[Tuple[int, float]], metric: str) -> Optional[int]:
    """The index of the best (index, score) pair (the first among equals), or None when there is none."""
    best = None
    for index, value in scores:
        if best is None or better(metric, value, best[1]):
            best = (index, value)
    return None if best is None else best[0]


# ---------------------------------------------------------------- the rehearsal on public rows (tune.rows: public)
def rehearsal_rows(data, seed: int, fold: int = 0, folds: int = 4):
    """One fold of the rehearsal's rows, all public: the public split in ``folds`` public-seeded parts, part
    ``fold`` held out (it scores the settings when score.split is public, and guides a public-guided
    estimator), the others trained on as the private rows would be. Over the folds every public row is held
    out once. The private rows are not in it."""
    import numpy as np

    from components.data.split import Part, SplitData
    from components.randomness import STREAM_REHEARSAL, public_seed

    public = data.public
    if len(public) < max(8, 2 * folds):
        raise ValueError(f"tune.rows: public needs public rows to train and score the settings on ({folds} folds of "
                         f"at least 2), and the split has {len(public)}; give data.split a larger public fraction, "
                         "fewer tune.folds, or tune rows: private")
    order = np.random.default_rng(public_seed(seed, STREAM_REHEARSAL)).permutation(len(public))
    parts = np.array_split(order, folds)
    held = parts[fold]
    rest = np.concatenate([p for i, p in enumerate(parts) if i != fold])

    def part(idx):
        idx = np.sort(idx)
        return Part(public.features[idx], public.labels[idx], [public.fingerprints[i] for i in idx],
                    None if public.persons is None else public.persons[idx])

    return SplitData(public=part(held), private=part(rest), test=data.test,
                     n_classes=data.n_classes, n_features=data.n_features, layout=data.layout,
                     preprocessing=data.preprocessing)


def rehearsal_spec(search, n_train: int, n_private: int):
    """The calibrated search as the rehearsal runs it on ``n_train`` public rows: the private stage's steps, its
    batch capped at the rows there are, and its noise per example: sigma scaled by the batches' ratio, so the
    noise on a step's mean gradient is what the private stage's will be on its ``n_private`` rows (a smaller
    batch at the same sigma would weigh the noise more than the private run will). No budget: nothing private
    is read, nothing is charged."""
    from specs.run import RunSpec

    data = search.model_dump(mode="json")
    data["budget"] = None
    data["optimizer"]["steps"], data["optimizer"]["epochs"] = int(search.optimizer.steps), None
    private_batch = search.batch_size(n_private)
    sampling = data["sampling"]
    for field in ("expected_batch_size", "batch_size"):
        if field in sampling:
            sampling[field] = min(int(sampling[field]), n_train)
    if data["data"].get("declared_private_rows") is not None:
        data["data"]["declared_private_rows"] = n_train
    spec = RunSpec.model_validate(data)
    sigma = search.mechanism.noise_multiplier
    if isinstance(sigma, (int, float)) and private_batch:
        data["mechanism"]["noise_multiplier"] = float(sigma) * spec.batch_size(n_train) / private_batch
        spec = RunSpec.model_validate(data)
    return spec


def ranked(rows: List[Dict], metric: str) -> List[Dict]:
    """A rehearsal's settings best first: by ``metric`` (accuracy higher, loss lower), ties by the other of the
    two, then by the space's order; a setting that failed (no score) last. Each row: setting, scores (a dict of
    the metrics, or None)."""
    other = "loss" if metric == "accuracy" else "accuracy"

    def key(indexed):
        index, row = indexed
        scores = row["scores"]
        if not scores or not _finite(scores.get(metric)):
            return (1, 0.0, 0.0, index)
        sign = -1.0 if metric == "accuracy" else 1.0
        tie = scores.get(other)
        tie_sign = -1.0 if other == "accuracy" else 1.0
        return (0, sign * scores[metric], tie_sign * tie if _finite(tie) else 0.0, index)

    return [row for _, row in sorted(enumerate(rows), key=key)]


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
