"""RDP, PLD and zCDP accounting with dp-accounting; the accountant is a pure consumer of DpEvents."""
from __future__ import annotations

import collections
import json
import logging
import math
from typing import Any, Callable, Dict, Optional, Tuple

import attr
import dp_accounting
import numpy as np
from dp_accounting import pld, rdp
from dp_accounting.rdp import rdp_privacy_accountant as rdp_conversion


class _ExcludedOrderFilter(logging.Filter):
    """dp-accounting's RDP series for a (q, sigma, order) that does not converge is taken as infinite RDP,
    so that order drops out of the minimum and epsilon can only come out larger: conservative. Its
    warning repeats for every probe of the sigma search and every epsilon logged during a run, and
    gives the user nothing to act on, so privzo drops it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "_compute_log_a_frac failed to converge" not in str(record.msg)


logging.getLogger("absl").addFilter(_ExcludedOrderFilter())

_RELATIONS = {
    "add_remove": dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
    "replace_one": dp_accounting.NeighboringRelation.REPLACE_ONE,
}


class ZCdpAccountant(dp_accounting.PrivacyAccountant):
    """rho-zCDP (Bun and Steinke 2016) as a dp-accounting accountant: composition adds rho.

    Only events with an exact zCDP bound are taken: the Gaussian mechanism (noise multiplier sigma,
    std / sensitivity under the relation, is exactly 1 / (2 sigma^2)-zCDP), ZCDpEvent itself, and no-op
    or non-private events. Subsampled events are refused: no tight zCDP bound exists for them (the
    amplification is not a linear Renyi curve), so rdp or pld must account for them. epsilon at delta
    comes from dp-accounting's RDP-to-DP conversion of the composed rho over a finer grid of orders
    than its RDP accountant's (a superset), so for unsampled Gaussian steps zcdp is never above rdp."""

    def __init__(self, neighboring_relation: dp_accounting.NeighboringRelation):
        super().__init__(neighboring_relation)
        self.rho = 0.0

    def _maybe_compose(self, event, count, do_compose) -> Optional[dp_accounting.PrivacyAccountant.CompositionErrorDetails]:
        rho = event_rho(event)
        if rho is None:
            return self.CompositionErrorDetails(
                invalid_event=event, error_message=f"no zCDP bound for {describe_event(event)}; use rdp or pld")
        if do_compose:
            self.rho += rho * count if rho > 0 and count > 0 else 0.0
        return None

    def get_epsilon(self, target_delta: float) -> float:
        if self.rho == 0:
            return 0.0
        if math.isinf(self.rho):
            return math.inf
        eps, _ = rdp_conversion.compute_epsilon(_ZCDP_ORDERS, self.rho * _ZCDP_ORDERS, target_delta)
        return float(eps)

    def get_delta(self, target_epsilon: float) -> float:
        if self.rho == 0:
            return 0.0
        if math.isinf(self.rho):
            return 1.0
        delta, _ = rdp_conversion.compute_delta(_ZCDP_ORDERS, self.rho * _ZCDP_ORDERS, target_epsilon)
        return float(delta)


# rho-zCDP is RDP of rho * alpha at every order alpha, so converting costs nothing per order: the RDP
# accountant's orders plus a dense fill (its grid is coarse near 1, where the best order for large rho lies)
_ZCDP_ORDERS = np.unique(np.concatenate([
    np.asarray(rdp_conversion.DEFAULT_RDP_ORDERS, dtype=np.float64),
    np.linspace(1.011, 2.0, 200), np.geomspace(2.0, 1e5, 2000)]))


def event_rho(event: dp_accounting.DpEvent) -> Optional[float]:
    """rho of ``event`` under zCDP, or None when it has no exact zCDP bound."""
    if isinstance(event, dp_accounting.NoOpDpEvent):
        return 0.0
    if isinstance(event, dp_accounting.NonPrivateDpEvent):
        return math.inf
    if isinstance(event, dp_accounting.ZCDpEvent):
        rho = float(event.rho)
        return rho if rho >= 0 else None  # a negative or NaN rho is no bound (a crafted or corrupt event)
    if isinstance(event, dp_accounting.GaussianDpEvent):
        variance = float(event.noise_multiplier) ** 2  # underflows to 0 for sigma below ~1e-162
        return math.inf if variance == 0 else 1.0 / (2.0 * variance)
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        inner = event_rho(event.event)
        return None if inner is None else (inner * event.count if inner > 0 and event.count > 0 else 0.0)
    if isinstance(event, dp_accounting.ComposedDpEvent):
        parts = [event_rho(e) for e in event.events]
        return None if any(p is None for p in parts) else float(sum(parts))
    return None


def beyond_plan(planned: dp_accounting.DpEvent, executed: dp_accounting.DpEvent,
                steps: Optional[Tuple[int, int]] = None) -> Optional[str]:
    """Why ``executed`` is not ``planned`` cut short (None if it is): the same releases, each composed at most
    as often as planned. What a run executes is its plan, or a prefix of it (a crash, an early stop, a tree's
    partial period); any other event, e.g. the plan's with more noise (a smaller epsilon), was not what the
    run reserved. A composition's parts are matched one to one, in any order; a part may be missing (none of
    its releases ran). ``steps``: (planned, run); a plan of one release a step then runs one a step run."""
    if steps is not None:
        planned_steps, run = steps
        if run > planned_steps:
            return f"{run} steps run where {planned_steps} were planned"
        if isinstance(planned, dp_accounting.SelfComposedDpEvent) and planned.count == planned_steps \
                and isinstance(executed, dp_accounting.SelfComposedDpEvent) and executed.count != run:
            return f"{executed.count} releases for the {run} steps it ran"
    if isinstance(executed, dp_accounting.NoOpDpEvent):
        # nothing released: only a run that ran no step executes that
        return None if steps is None or steps[1] == 0 else f"nothing released for the {steps[1]} steps it ran"
    if executed == planned:
        return None
    if isinstance(planned, dp_accounting.SelfComposedDpEvent):
        if isinstance(executed, dp_accounting.SelfComposedDpEvent) and executed.event == planned.event:
            return None if executed.count <= planned.count else (
                f"{executed.count} releases where {planned.count} were planned")
        if executed == planned.event:
            return None
        return "its releases are not the planned ones (noise, sampling or clip differ)"
    if isinstance(planned, dp_accounting.ComposedDpEvent):
        parts = list(executed.events) if isinstance(executed, dp_accounting.ComposedDpEvent) else [executed]
        left = list(planned.events)
        for part in parts:
            match = next((i for i, p in enumerate(left) if beyond_plan(p, part) is None), None)
            if match is None:
                return "a part of it is not a part of the plan (noise, sampling or clip differ)"
            left.pop(match)
        return None
    return "it is not the planned event (noise, sampling or clip differ)"


def gaussian_equivalent(event: dp_accounting.DpEvent) -> Optional[dp_accounting.GaussianDpEvent]:
    """A composition made of Gaussian releases only, as the one Gaussian it equals exactly: multipliers
    z_i composed add as 1 / z^2 = sum 1 / z_i^2 (mu-GDP composes exactly: Dong, Roth and Su 2022). None
    when some part is not a plain Gaussian."""
    def inverse_square(e) -> Optional[float]:
        if isinstance(e, dp_accounting.GaussianDpEvent):
            return 1.0 / e.noise_multiplier ** 2
        if isinstance(e, dp_accounting.SelfComposedDpEvent):
            inner = inverse_square(e.event)
            return None if inner is None else e.count * inner
        if isinstance(e, dp_accounting.ComposedDpEvent):
            parts = [inverse_square(p) for p in e.events]
            return None if any(p is None for p in parts) else sum(parts)
        return None

    total = inverse_square(event)
    return None if not total else dp_accounting.GaussianDpEvent(total ** -0.5)


class Accountant:
    """Factory of fresh dp-accounting accountants of one kind and neighbouring relation."""

    def __init__(self, kind: str = "rdp", neighboring: str = "add_remove"):
        if kind not in ("rdp", "pld", "zcdp"):
            raise ValueError(f"privacy.accountant: unknown {kind!r}; allowed: rdp, pld, zcdp")
        if neighboring not in _RELATIONS:
            raise ValueError(f"privacy.neighboring: unknown {neighboring!r}; allowed: {', '.join(_RELATIONS)}")
        self.kind = kind
        self.neighboring = neighboring

    def fresh(self) -> dp_accounting.PrivacyAccountant:
        relation = _RELATIONS[self.neighboring]
        if self.kind == "rdp":
            return rdp.RdpAccountant(neighboring_relation=relation)
        if self.kind == "zcdp":
            return ZCdpAccountant(neighboring_relation=relation)
        return pld.PLDAccountant(neighboring_relation=relation)

    def rho(self, event: dp_accounting.DpEvent) -> Optional[float]:
        """The zCDP rho of ``event`` when this accountant is zcdp (what it composes), else None."""
        if self.kind != "zcdp":
            return None
        acc = self.fresh()
        if not acc.supports(event):
            raise ValueError(f"zcdp accountant cannot account for {describe_event(event)} ({self.neighboring})")
        return acc.compose(event).rho

    def native(self, event: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
        """``event`` in the units of the dp-accounting accountant that composes it.

        privzo's noise multiplier is always std / sensitivity, the sensitivity being C for add/remove and
        2C for replace-one (GaussianMechanism), which is what dp-accounting's RDP accountant assumes under
        either relation. Its PLD accountant under REPLACE_ONE instead measures the noise against C, the
        shift of one record (the two neighbours sit at -C and +C), and would count privzo's noise as half
        of what it is. A Gaussian of multiplier sigma is therefore handed to it as 2 sigma. Subsampled
        events have no such translation and are refused there (the spec rules never produce them)."""
        if self.kind != "pld" or self.neighboring != "replace_one":
            return event
        if isinstance(event, dp_accounting.GaussianDpEvent):
            return dp_accounting.GaussianDpEvent(2.0 * event.noise_multiplier)
        if isinstance(event, dp_accounting.SelfComposedDpEvent):
            return dp_accounting.SelfComposedDpEvent(self.native(event.event), event.count)
        if isinstance(event, dp_accounting.ComposedDpEvent):
            collapsed = gaussian_equivalent(event)
            if collapsed is not None:  # exact, and one PLD instead of a composition of many
                return self.native(collapsed)
            return dp_accounting.ComposedDpEvent([self.native(e) for e in event.events])
        if isinstance(event, (dp_accounting.NoOpDpEvent, dp_accounting.NonPrivateDpEvent)):
            return event
        raise ValueError(f"pld accountant under replace_one: no exact accounting for {type(event).__name__}; "
                         "use accountant: rdp")

    def supports(self, event: dp_accounting.DpEvent) -> bool:
        try:
            return self.fresh().supports(self.native(event))
        except ValueError:
            return False

    def epsilon(self, event: dp_accounting.DpEvent, delta: float) -> float:
        """epsilon of ``event`` at ``delta``. Fails closed: anything unaccountable is infinite epsilon."""
        acc = self.fresh()
        native = self.native(event)  # says itself what it cannot translate
        if not acc.supports(native):
            raise ValueError(f"{self.kind} accountant cannot account for {describe_event(event)} ({self.neighboring})")
        eps = float(acc.compose(native).get_epsilon(delta))
        return eps if math.isfinite(eps) and eps >= 0 else math.inf

    def calibrate(self, make_event: Callable[[float], dp_accounting.DpEvent], epsilon: float, delta: float) -> float:
        """Smallest noise multiplier whose event meets (epsilon, delta), via dp-accounting's
        ``calibrate_dp_mechanism`` with a fresh accountant per probe. The search returns the upper end of
        its bracket, so the result never gives less privacy than asked; it is re-checked here, every time.

        The search (a dozen compositions, most of a small run's set-up) is kept for the process, keyed by
        the accountant, the target and the events ``make_event`` gives at CALIBRATION_PROBES: for the events
        privzo plans, where sigma is each Gaussian's noise multiplier, those fix the event at every sigma, so
        a kept sigma is the one the search would give. Whatever the key missed, the re-check stands."""
        try:
            key: Optional[tuple] = (self.kind, self.neighboring, float(epsilon), float(delta),
                                    tuple(event_to_json(make_event(probe)) for probe in CALIBRATION_PROBES))
        except Exception:  # noqa: BLE001 - an event the probes cannot make or write is searched every time
            key = None
        sigma = None if key is None else _CALIBRATED.get(key)
        if sigma is None:
            sigma = self._search(make_event, epsilon, delta)
        achieved = self.epsilon(make_event(sigma), delta)
        if not achieved <= epsilon:
            raise ArithmeticError(f"calibration gave sigma={sigma} with epsilon {achieved} > target {epsilon}")
        if key is not None:
            _CALIBRATED[key] = sigma
            _CALIBRATED.move_to_end(key)
            while len(_CALIBRATED) > CALIBRATIONS_KEPT:
                _CALIBRATED.popitem(last=False)
        return sigma

    def _search(self, make_event: Callable[[float], dp_accounting.DpEvent], epsilon: float, delta: float) -> float:
        bracket = None
        unit = gaussian_equivalent(make_event(1.0))
        if unit is not None and unit.noise_multiplier > 0:
            # a composition of Gaussians scales with sigma: start the search where the equivalent Gaussian is
            # near the target (far below it, a PLD of a nearly noiseless Gaussian takes minutes to build)
            from statistics import NormalDist

            mu = max(NormalDist().inv_cdf(1 - delta / 2) / max(epsilon, 1e-9), 1e-3) ** -1
            bracket = dp_accounting.LowerEndpointAndGuess(0.0, 1.0 / (mu * unit.noise_multiplier))
        return float(
            dp_accounting.calibrate_dp_mechanism(
                self.fresh,
                # the search starts at sigma = 0, where dp-accounting's sampling-without-replacement RDP
                # divides by zero; no noise is a non-private event, whatever the sampling
                lambda sigma: self.native(make_event(sigma)) if sigma > 0 else dp_accounting.NonPrivateDpEvent(),
                epsilon,
                delta,
                bracket_interval=bracket,
            )
        )


CALIBRATION_PROBES = (0.5, 1.0, 3.0)
CALIBRATIONS_KEPT = 256
_CALIBRATED: "collections.OrderedDict[tuple, float]" = collections.OrderedDict()


def describe_event(event: dp_accounting.DpEvent) -> str:
    """The event types inside ``event``, for an error message ("ComposedDpEvent" alone says nothing)."""
    inner = []

    def walk(e):
        if isinstance(e, dp_accounting.ComposedDpEvent):
            for sub in e.events:
                walk(sub)
        elif isinstance(e, dp_accounting.SelfComposedDpEvent):
            walk(e.event)
        elif type(e).__name__ not in inner:
            inner.append(type(e).__name__)
            if hasattr(e, "event"):
                inner[-1] += f" of {type(e.event).__name__}"

    walk(event)
    return ", ".join(inner)


class PrivacyTracker:
    """Counts the private steps actually executed; the run's event is their exact composition. Every tracker
    is a components.protocols.Tracker; ScheduledTracker also CountsStarts, FilterTracker is a PrivacyFilter."""

    def __init__(self, accountant: Accountant, step_event: dp_accounting.DpEvent, delta: float):
        self.accountant = accountant
        self.step_event = step_event
        self.delta = delta
        self.steps = 0

    def record_step(self) -> None:
        self.steps += 1

    def event(self) -> dp_accounting.DpEvent:
        if self.steps == 0:
            return dp_accounting.NoOpDpEvent()
        return dp_accounting.SelfComposedDpEvent(self.step_event, self.steps)

    def rho(self) -> Optional[float]:
        """zCDP rho of the executed steps when the accountant is zcdp, else None."""
        return self.accountant.rho(self.event())

    def epsilon(self) -> float:
        if self.steps == 0:
            return 0.0
        if isinstance(self.step_event, dp_accounting.NonPrivateDpEvent):
            return math.inf
        return self.accountant.epsilon(self.event(), self.delta)

    def align(self) -> None:
        """After a rewind: round ``steps`` up to what the rewound run must keep charged. Every executed step
        is already counted here; only a tree burns the rest of a period cut short (TreeTracker)."""


class TreeTracker(PrivacyTracker):
    """A single pass with tree aggregation: every row is in one leaf of one period's tree, so after any
    number of steps the run's event is a worst-case row's, the row at position 1 of a period: J Gaussian
    releases of the node multiplier (J = floor(log2 period) + 1; fewer while the first period is still
    under way). ``steps`` counts every step executed, and ``align`` rounds it up to whole periods when a
    run is rewound: the rows of a period cut short are never read again (SinglePassSampler)."""

    def __init__(self, accountant: Accountant, noise_multiplier: float, period: int, delta: float):
        from components.mechanisms.tree import tree_event

        super().__init__(accountant, dp_accounting.GaussianDpEvent(noise_multiplier), delta)
        self.period = int(period)
        self._tree_event = tree_event
        self.noise_multiplier = float(noise_multiplier)

    def event(self) -> dp_accounting.DpEvent:
        if self.steps == 0:
            return dp_accounting.NoOpDpEvent()
        return self._tree_event(self.noise_multiplier, min(self.steps, self.period))

    def align(self) -> None:
        """Whole periods: the rows of a period cut short are never read again."""
        self.steps = -(-self.steps // self.period) * self.period


class ScheduledTracker(PrivacyTracker):
    """Full-batch steps of two release classes (Kornowski et al.'s multi-pass algorithm): a restart every ``period``
    steps and differences between. Each executed step is counted in its class as it is recorded (a step
    discarded by a retry stays charged, in its own class); the event is their exact composition, each
    release wrapped by ``wrap``, the sampler's event of one batch (Poisson-subsampled in footnote 2's variant)."""

    def __init__(self, accountant: Accountant, multipliers, period: int, delta: float,
                 wrap: Callable[[dp_accounting.DpEvent], dp_accounting.DpEvent] = lambda event: event):
        super().__init__(accountant, wrap(dp_accounting.GaussianDpEvent(multipliers[0])), delta)
        self.wrap = wrap
        self.multipliers = tuple(float(z) for z in multipliers)
        self.period = int(period)
        self.starts = 0
        self.is_start = lambda: True  # the loop's builder points this at the mechanism's position

    def record_step(self) -> None:
        self.starts += bool(self.is_start())
        super().record_step()

    def event(self) -> dp_accounting.DpEvent:
        from components.mechanisms.scheduled import scheduled_event

        if self.steps == 0:
            return dp_accounting.NoOpDpEvent()
        return scheduled_event(*self.multipliers, self.starts, self.steps - self.starts, self.wrap)


class PrivacyFilterError(RuntimeError):
    """A release would take the realised spend past the run's budget: it is refused before it exists."""


class FilterTracker(PrivacyTracker):
    """A privacy filter (the KL paper's runs): every release's exact zCDP cost is charged before it exists and
    refused past ``budget``; while the realised spend is at most ``threshold`` another step may start (its
    releases cost at most budget - threshold). The costs may depend on earlier releases (adaptive noise,
    early stops), and rho-zCDP / mu-GDP filters make the whole run ``charged`` (Whitehouse et al. 2022;
    Smith and Thakurta 2022): the run is charged that, the plan or the budget, whatever it executed. The
    realised spend is shown, never reported as the guarantee."""

    def __init__(self, accountant: Accountant, charged: dp_accounting.DpEvent, budget: float, delta: float,
                 threshold: Optional[float] = None, step_cost_bound: float = 0.0):
        super().__init__(accountant, charged, delta)
        self.budget = float(budget)
        self.threshold = self.budget if threshold is None else float(threshold)
        self.step_cost_bound = float(step_cost_bound)
        self.spent = 0.0

    def charge(self, cost: float) -> None:
        if not (cost >= 0 and math.isfinite(cost)):
            raise PrivacyFilterError(f"privacy filter: a release of cost {cost} cannot be accounted")
        if self.spent + cost > self.budget * (1 + 1e-12):
            raise PrivacyFilterError(f"privacy filter: a release of zCDP cost {cost:.4g} would take the spend "
                                     f"{self.spent:.6g} past the budget {self.budget:.6g}; refused")
        self.spent += cost

    def open(self) -> bool:
        """Whether another step may start."""
        return self.spent <= self.threshold * (1 + 1e-12)

    def affords(self, cost: float) -> bool:
        return self.spent + cost <= self.budget * (1 + 1e-12)

    def event(self) -> dp_accounting.DpEvent:
        return dp_accounting.NoOpDpEvent() if self.steps == 0 else self.step_event


class OncePerRowTracker(PrivacyTracker):
    """A single pass with one Gaussian release per step: every row is in exactly one release, so the run's
    event is that one Gaussian however many steps ran (parallel composition over disjoint batches)."""

    def event(self) -> dp_accounting.DpEvent:
        return dp_accounting.NoOpDpEvent() if self.steps == 0 else self.step_event


class SelectionTracker:
    """A search's candidate (privzo tune): what its loop executes, counted by the tracker its mechanism built
    (``inner``), released as the best of K such runs (``select``: that composition to the search's
    RepeatAndSelect event). Everything else, what the loop reads and writes of a tracker (steps, starts, a
    filter's spend), is the inner tracker's: the wrapper forwards both, so the loop's protocol checks see it."""

    _OWN = ("inner", "select")

    def __init__(self, inner: Any, select: Callable[[dp_accounting.DpEvent], dp_accounting.DpEvent]):
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "select", select)

    def event(self) -> dp_accounting.DpEvent:
        return self.select(self.inner.event())

    def epsilon(self) -> float:
        return self.inner.accountant.epsilon(self.event(), self.inner.delta)

    def rho(self) -> Optional[float]:
        return None  # a selection's guarantee is its (epsilon, delta) from RDP, never a zCDP rho

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.inner, name, value)


# ------------------------------------------------------------------ serialisation (closed registry)
_EVENT_TYPES: Dict[str, type] = {
    cls.__name__: cls
    for cls in (
        dp_accounting.NoOpDpEvent,
        dp_accounting.NonPrivateDpEvent,
        dp_accounting.GaussianDpEvent,
        dp_accounting.LaplaceDpEvent,
        dp_accounting.PoissonSampledDpEvent,
        dp_accounting.SampledWithoutReplacementDpEvent,
        dp_accounting.SampledWithReplacementDpEvent,
        dp_accounting.SelfComposedDpEvent,
        dp_accounting.ComposedDpEvent,
        dp_accounting.SingleEpochTreeAggregationDpEvent,
        dp_accounting.ZCDpEvent,
        dp_accounting.dp_event.RepeatAndSelectDpEvent,  # privzo tune: the best of K candidates
    )
}


def _to_plain(event: Any) -> Any:
    if attr.has(type(event)):
        fields = {f.name: _to_plain(getattr(event, f.name)) for f in attr.fields(type(event))}
        return {"type": type(event).__name__, **fields}
    if isinstance(event, (list, tuple)):
        return [_to_plain(e) for e in event]
    return event


def _from_plain(value: Any) -> Any:
    if isinstance(value, dict) and "type" in value:
        cls = _EVENT_TYPES.get(value["type"])
        if cls is None:
            raise ValueError(f"unknown DpEvent type {value['type']!r}; allowed: {', '.join(sorted(_EVENT_TYPES))}")
        return cls(**{k: _from_plain(v) for k, v in value.items() if k != "type"})
    if isinstance(value, list):
        return [_from_plain(v) for v in value]
    return value


def event_to_json(event: dp_accounting.DpEvent) -> str:
    return json.dumps(_to_plain(event), indent=2, sort_keys=True)


def event_from_json(text: str) -> dp_accounting.DpEvent:
    return _from_plain(json.loads(text))
