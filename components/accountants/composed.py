"""A composition kept between runs: an accountant's exact state after composing a sequence of DpEvents, that
can be stored, restored and composed further.

The ledger keeps one per block of data, so a reservation composes the new run's event onto the block's
stored state instead of recomposing the block's whole history (whose cost grew with every run). The state
is dp-accounting's own: the RDP accountant's values at its fixed orders, the zCDP rho, or the PLD
accountant's two probability mass functions. Composing onto a restored state is the same arithmetic as
composing the whole sequence in one accountant, which composes event by event too; only the order of the
floating-point sums may differ from one recomposed in another order.
"""
from __future__ import annotations

import base64
import copy
import json
import math
from typing import Iterable, Optional

import dp_accounting
import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

from components.accountants.accounting import Accountant, ZCdpAccountant, describe_event


def _floats_to_text(values: np.ndarray) -> str:
    """float64 values as text that restores them bit for bit."""
    return base64.b64encode(np.ascontiguousarray(values, dtype="<f8").tobytes()).decode("ascii")


def _floats_from_text(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<f8").copy()


def _pmf_to_dict(pmf: pld_pmf.PLDPmf) -> dict:
    common = {"discretization": pmf._discretization, "infinity_mass": pmf._infinity_mass,
              "pessimistic": bool(pmf._pessimistic_estimate)}
    if isinstance(pmf, pld_pmf.DensePLDPmf):
        return {"type": "dense", "lower_loss": int(pmf._lower_loss), "probs": _floats_to_text(pmf._probs), **common}
    losses = sorted(pmf._loss_probs)
    return {"type": "sparse", "losses": [int(k) for k in losses],
            "probs": _floats_to_text(np.array([pmf._loss_probs[k] for k in losses], dtype=np.float64)), **common}


def _pmf_from_dict(d: dict) -> pld_pmf.PLDPmf:
    if d["type"] == "dense":
        return pld_pmf.DensePLDPmf(d["discretization"], d["lower_loss"], _floats_from_text(d["probs"]),
                                   d["infinity_mass"], d["pessimistic"])
    probs = _floats_from_text(d["probs"])
    return pld_pmf.SparsePLDPmf(dict(zip(d["losses"], probs.tolist())), d["discretization"], d["infinity_mass"],
                                d["pessimistic"])


class ComposedState:
    """The composition of the events charged so far under one ``Accountant`` (kind and neighbouring relation),
    and how many events it holds. Immutable: ``composed`` returns a new state."""

    def __init__(self, accountant: Accountant, state: Optional[dp_accounting.PrivacyAccountant] = None,
                 count: int = 0):
        self.accountant = accountant
        self._state = state if state is not None else accountant.fresh()
        self.count = count

    def _copied(self) -> dp_accounting.PrivacyAccountant:
        # the RDP accountant adds into its array in place, the others replace their state: copy what is
        # mutable (a PLD's mass functions, megabytes, are never changed in place and are shared)
        if isinstance(self._state, dp_accounting.pld.PLDAccountant):
            return copy.copy(self._state)
        return copy.deepcopy(self._state)

    def composed(self, events: Iterable[dp_accounting.DpEvent]) -> "ComposedState":
        """This composition followed by ``events``. Raises ValueError for an event the accountant cannot
        account for (the ledger refuses such a run before anything is written)."""
        state = self._copied()
        count = self.count
        for event in events:
            native = self.accountant.native(event)
            if not state.supports(native):
                raise ValueError(f"{self.accountant.kind} accountant cannot account for {describe_event(event)} "
                                 f"({self.accountant.neighboring})")
            state.compose(native)
            count += 1
        return ComposedState(self.accountant, state, count)

    def plus(self, other: "ComposedState") -> "ComposedState":
        """This composition followed by ``other``'s (the same accountant): what composing ``other``'s events
        here would give, without recomputing them. The ledger plans an event once and adds it to each block."""
        if (other.accountant.kind, other.accountant.neighboring) != (self.accountant.kind, self.accountant.neighboring):
            raise ValueError("composed states of different accountants cannot be composed")
        if other.count == 0:
            return self
        if self.count == 0:
            return other
        state = self._copied()
        if isinstance(state, dp_accounting.rdp.RdpAccountant):
            if not np.array_equal(state._orders, other._state._orders):
                raise ValueError("composed RDP states at different orders cannot be composed")
            state._rdp = state._rdp + other._state._rdp
        elif isinstance(state, ZCdpAccountant):
            state.rho = state.rho + other._state.rho
        else:
            state._pld = state._pld.compose(other._state._pld)
            state._contains_non_dp_event = state._contains_non_dp_event or other._state._contains_non_dp_event
        return ComposedState(self.accountant, state, self.count + other.count)

    def epsilon(self, delta: float) -> float:
        """epsilon at ``delta``; fails closed (anything not finite is infinite). Nothing composed is 0."""
        if self.count == 0:
            return 0.0
        eps = float(self._state.get_epsilon(delta))
        return eps if math.isfinite(eps) and eps >= 0 else math.inf

    # ------------------------------------------------------------------ storage
    def to_json(self) -> str:
        s = self._state
        if isinstance(s, dp_accounting.rdp.RdpAccountant):
            body = {"orders": _floats_to_text(s._orders), "rdp": _floats_to_text(s._rdp)}
        elif isinstance(s, ZCdpAccountant):
            body = {"rho": s.rho}
        else:
            pld = s._pld
            body = {"discretization": s._value_discretization_interval, "non_dp": bool(s._contains_non_dp_event),
                    "remove": _pmf_to_dict(pld._pmf_remove),
                    "add": None if pld._symmetric else _pmf_to_dict(pld._pmf_add)}
        return json.dumps({"kind": self.accountant.kind, "neighboring": self.accountant.neighboring,
                           "count": self.count, **body}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ComposedState":
        d = json.loads(text)
        accountant = Accountant(d["kind"], d["neighboring"])
        state = accountant.fresh()
        if d["kind"] == "rdp":
            state._orders, state._rdp = _floats_from_text(d["orders"]), _floats_from_text(d["rdp"])
        elif d["kind"] == "zcdp":
            state.rho = float(d["rho"])
        else:
            state._value_discretization_interval = d["discretization"]
            state._contains_non_dp_event = d["non_dp"]
            state._pld = PrivacyLossDistribution(_pmf_from_dict(d["remove"]),
                                                 None if d["add"] is None else _pmf_from_dict(d["add"]))
        return cls(accountant, state, int(d["count"]))


def scaled_noise(event: dp_accounting.DpEvent, factor: float) -> dp_accounting.DpEvent:
    """``event`` with every noise multiplier times ``factor``: the same run, calibrated to a smaller epsilon
    (its steps, sampling and structure unchanged). Events without noise are returned as they are."""
    if isinstance(event, dp_accounting.GaussianDpEvent):
        return dp_accounting.GaussianDpEvent(event.noise_multiplier * factor)
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        return dp_accounting.SelfComposedDpEvent(scaled_noise(event.event, factor), event.count)
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return dp_accounting.ComposedDpEvent([scaled_noise(e, factor) for e in event.events])
    if isinstance(event, (dp_accounting.PoissonSampledDpEvent, dp_accounting.SampledWithoutReplacementDpEvent,
                          dp_accounting.SampledWithReplacementDpEvent)):
        return type(event)(**{**_fields(event), "event": scaled_noise(event.event, factor)})
    if isinstance(event, dp_accounting.ZCDpEvent):
        return dp_accounting.ZCDpEvent(event.rho / factor ** 2)
    return event


def _fields(event) -> dict:
    import attr

    return attr.asdict(event, recurse=False)
