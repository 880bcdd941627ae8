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
    """The search's event: the best of K runs of ``candidate``, K drawn from the tune's law."""
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
    law = RepeatLaw(tune.candidates)
    grid = tune.settings()
    big = max(1, math.ceil(3 * law.mean))
    return [
        f"tune: the best of K candidates over {len(grid)} settings of {', '.join(tune.space)}, scored by "
        f"{tune.score.metric} on the {tune.score.split} rows; K ~ {law.describe()}, P(K > {big}) = {law.tail(big):.3g}"
        + ("; K = 0 (nothing released) with probability " + f"{law.pmf(0):.3g}" if math.isinf(law.shape) else ""),
        f"tune: each candidate ({candidate_epsilon:.4g}, {delta:.3g})-DP alone; the released winner, the selection "
        f"included, ({total_epsilon:.4g}, {delta:.3g})-DP",
    ]


def winner(scores: List[Tuple[int, float]], metric: str) -> Optional[int]:
    """The index of the best (index, score) pair (the first among equals), or None when there is none."""
    best = None
    for index, value in scores:
        if best is None or better(metric, value, best[1]):
            best = (index, value)
    return None if best is None else best[0]


# ---------------------------------------------------------------- the rehearsal on public rows (tune.rows: public)
REHEARSAL_SCORED = 0.25  # the public rows held out to score each setting; the rest train it


def rehearsal_rows(data, seed: int):
    """The rehearsal's rows, all public: a public-seeded quarter of the public split held out (it scores the
    settings when score.split is public, and guides a public-guided estimator), the rest trained on as the
    private rows would be. The private rows are not in it."""
    import numpy as np

    from components.data.split import Part, SplitData
    from components.randomness import STREAM_REHEARSAL, public_seed

    public = data.public
    if len(public) < 8:
        raise ValueError(f"tune.rows: public needs public rows to train and score the settings on, and the split has "
                         f"{len(public)}; give data.split a larger public fraction, or tune rows: private")
    order = np.random.default_rng(public_seed(seed, STREAM_REHEARSAL)).permutation(len(public))
    held = max(1, int(round(REHEARSAL_SCORED * len(public))))

    def part(idx):
        idx = np.sort(idx)
        return Part(public.features[idx], public.labels[idx], [public.fingerprints[i] for i in idx],
                    None if public.persons is None else public.persons[idx])

    return SplitData(public=part(order[:held]), private=part(order[held:]), test=data.test,
                     n_classes=data.n_classes, n_features=data.n_features, layout=data.layout,
                     preprocessing=data.preprocessing)


def rehearsal_spec(search, n_train: int):
    """The calibrated search as the rehearsal runs it on ``n_train`` public rows: the private search's steps and
    sigma, its batch capped at the rows there are, no budget (nothing private is read, nothing is charged)."""
    from specs.run import RunSpec

    data = search.model_dump(mode="json")
    data["budget"] = None
    data["optimizer"]["steps"], data["optimizer"]["epochs"] = int(search.optimizer.steps), None
    sampling = data["sampling"]
    for field in ("expected_batch_size", "batch_size"):
        if field in sampling:
            sampling[field] = min(int(sampling[field]), n_train)
    if data["data"].get("declared_private_rows") is not None:
        data["data"]["declared_private_rows"] = n_train
    return RunSpec.model_validate(data)
