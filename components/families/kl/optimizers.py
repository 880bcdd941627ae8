"""Menart et al. (KL)'s optimizers, each a state machine over public values: it says which release comes next
(``request``), reads the released vector (``apply``) and says when it is done. The state (iterates, the
running gradient estimate, phase counters) is a function of the start, the public plan and earlier
releases, so it is checkpointed anywhere, and every replica that applies the same releases stays in step.

- ``KlSpider`` (Algorithm 1): phase k starts with a noisy full gradient; while fewer than T_k updates were
  made and the estimate is at least (7 / (8 gamma)) Phi_k^(1/kappa), it takes a normalised step of length
  Phi_k^(1/kappa) / (4 gamma L1) and, unless that was the phase's last update, releases the noisy gradient
  difference across the step (the estimate accumulates them). A phase ends early once the estimate is small.
- ``ProximalPoint`` (Algorithm 2 with Algorithm 4): outer step t runs T_in - 1 projected noisy GD steps on
  F(w) + L~1 |w - w_(t-1)|^2 (the regulariser's gradient is public), steps 1 / (L~1 s), projection on the ball of
  radius L0 / (2 L~1) around w_(t-1), and moves to the s-weighted average of w_1 .. w_T_in.
- ``AdaptiveNoisyGd`` (Algorithm 3): w <- w - eta grad_t while the privacy filter allows another step; the
  output is w_T, the iterate of the last gradient released (Theorem 4), or one iterate picked by the
  exponential mechanism (Theorem 5).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch

from components.directions import Directions
from components.queries import PerExampleGradientAt, Update
from components.registry import OPTIMIZERS


@dataclass(frozen=True, eq=False)
class Request:
    """One release an optimizer asks for (public)."""

    kind: str  # gradient | difference | adaptive | select
    clip: float
    std: float = 0.0
    offset: Optional[Tuple[torch.Tensor, ...]] = None  # difference: the previous iterate minus this one
    norm_std: Optional[float] = None  # adaptive: the norm's std, then std_for(released norm)
    floor: float = 0.0
    divisor: float = 1.0
    offsets: Tuple[Tuple[torch.Tensor, ...], ...] = ()  # select: the candidates minus the parameters
    scale: float = 0.0  # select: lambda
    cost: float = 0.0  # select: its zCDP

    def query(self, offset=None) -> PerExampleGradientAt:
        if self.kind == "difference":
            return PerExampleGradientAt.at("gradient_difference", self.clip, self.offset)
        return PerExampleGradientAt.at("gradient", self.clip, offset)

    def std_for(self, norm: float) -> float:
        return max(norm / self.divisor, self.floor)


def _cost(rows: int, clip: float, std: float) -> float:
    """zCDP cost of a Gaussian release of std ``std`` on a full-batch mean of vectors clipped at ``clip``
    (replace-one: one row moves it by 2 clip / rows); the door charges the same."""
    return (2.0 * clip / rows) ** 2 / (2.0 * std ** 2)


def _flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).to(torch.float64) for t in tensors])


def _split(vector: torch.Tensor, like: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    out, at = [], 0
    for p in like:
        out.append(vector[at:at + p.numel()].view(p.shape).to(device=p.device, dtype=p.dtype))
        at += p.numel()
    return out


class _Iterate:
    def __init__(self, directions: Directions):
        self.directions = directions

    @property
    def point(self) -> torch.Tensor:
        return _flat(self.directions.params)

    @torch.no_grad()
    def move_to(self, vector: torch.Tensor) -> None:
        for p, v in zip(self.directions.params, _split(vector, self.directions.params)):
            p.copy_(v)

    def relative(self, vector: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        return tuple(_split(vector - self.point, self.directions.params))

    @staticmethod
    def released(update: Update) -> torch.Tensor:
        (tensors, coefficient), = update.dense
        return coefficient * _flat(tensors)


class KlSpider(_Iterate):
    def __init__(self, directions: Directions, plan):
        super().__init__(directions)
        self.plan = plan
        self.phase = 0
        self.t = 0
        self.estimate: Optional[torch.Tensor] = None
        self.previous: Optional[torch.Tensor] = None
        self.early_stops = 0  # phases ended by the gradient test (public: a function of releases)

    def request(self, tracker=None) -> Request:
        clip, std = self._next()
        if self.t == 0:
            return Request("gradient", clip, std)
        return Request("difference", clip, std, self.relative(self.previous))

    def done(self, tracker=None) -> bool:
        # a retried run re-spent some releases: it ends where the filter cannot pay for the next one
        return self.phase >= self.plan.phases or (tracker is not None and not tracker.affords(
            _cost(self.plan.rows, *self._next())))

    def _next(self) -> Tuple[float, float]:
        """(clip, std) of the next release."""
        if self.t == 0:
            return self.plan.start_clip, self.plan.start_std
        return self.plan.difference_clips[self.phase], self.plan.difference_stds[self.phase]

    @torch.no_grad()
    def apply(self, update: Update) -> None:
        plan, k = self.plan, self.phase
        released = self.released(update)
        self.estimate = released if self.t == 0 else self.estimate + released
        norm = float(torch.linalg.vector_norm(self.estimate))
        if self.t < plan.lengths[k] and norm >= plan.thresholds[k]:
            here = self.point
            self.previous = here
            self.move_to(here - plan.step_lengths[k] * self.estimate / norm)
            self.t += 1
            if self.t < plan.lengths[k]:
                return  # the difference across this step comes next
        else:
            self.early_stops += 1
        self.phase, self.t, self.estimate, self.previous = k + 1, 0, None, None

    def state_dict(self) -> dict:
        return {"phase": self.phase, "t": self.t, "early_stops": self.early_stops,
                "estimate": None if self.estimate is None else self.estimate.clone(),
                "previous": None if self.previous is None else self.previous.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.phase, self.t, self.early_stops = int(state["phase"]), int(state["t"]), int(state["early_stops"])
        self.estimate = None if state["estimate"] is None else state["estimate"].clone()
        self.previous = None if state["previous"] is None else state["previous"].clone()


class ProximalPoint(_Iterate):
    def __init__(self, directions: Directions, plan):
        super().__init__(directions)
        self.plan = plan
        self.outer = 0
        self.s = 1
        self.centre = self.point
        self.weighted = self.centre.clone()  # sum_s s w_s, from w_1 = the centre

    def request(self, tracker=None) -> Request:
        return Request("gradient", self.plan.clip, self.plan.std)

    def done(self, tracker=None) -> bool:
        return self.outer >= self.plan.outer or (tracker is not None and not tracker.affords(
            _cost(self.plan.rows, self.plan.clip, self.plan.std)))

    @torch.no_grad()
    def apply(self, update: Update) -> None:
        plan = self.plan
        here = self.point
        gradient = self.released(update) + 2 * plan.weak_convexity * (here - self.centre)
        moved = here - gradient / (plan.weak_convexity * self.s) - self.centre
        norm = float(torch.linalg.vector_norm(moved))
        if norm > plan.radius:
            moved = moved * (plan.radius / norm)
        following = self.centre + moved
        self.s += 1
        self.weighted += self.s * following
        if self.s < plan.inner:
            self.move_to(following)
            return
        average = self.weighted * (2.0 / (plan.inner * (plan.inner + 1)))
        self.move_to(average)
        self.outer += 1
        self.s, self.centre, self.weighted = 1, average, average.clone()

    @torch.no_grad()
    def finalize(self) -> None:
        """A run cut short inside an outer step (a retry's discarded steps end it early) outputs that step's
        weighted average so far."""
        if self.s > 1:
            self.move_to(self.weighted * (2.0 / (self.s * (self.s + 1))))

    def state_dict(self) -> dict:
        return {"outer": self.outer, "s": self.s, "centre": self.centre.clone(), "weighted": self.weighted.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.outer, self.s = int(state["outer"]), int(state["s"])
        self.centre, self.weighted = state["centre"].clone(), state["weighted"].clone()


class AdaptiveNoisyGd(_Iterate):
    def __init__(self, directions: Directions, plan, select: str = "last"):
        super().__init__(directions)
        if select not in ("last", "exponential"):
            raise ValueError(f"optimizer.select: {select!r}; allowed: last, exponential")
        self.plan = plan
        self.select = select
        self.iterates: List[torch.Tensor] = [self.point]  # w_0 .. (all of them only to select among)
        self.selected = False
        self.steps = 0

    def request(self, tracker) -> Optional[Request]:
        plan = self.plan
        if tracker.open():
            return Request("adaptive", plan.clip, norm_std=plan.norm_std, floor=plan.floor, divisor=plan.divisor)
        if self.select == "exponential" and not self.selected:
            candidates = self.iterates[:-1] if len(self.iterates) > 1 else self.iterates  # w_0 .. w_T
            return Request("select", plan.clip, offsets=tuple(self.relative(w) for w in candidates),
                           scale=plan.selection_scale, cost=plan.selection_rho)
        return None

    def done(self, tracker) -> bool:
        return not tracker.open() and (self.select == "last" or self.selected)

    @torch.no_grad()
    def apply(self, update: Update) -> None:
        info = dict(update.info)
        if "selected" in info:
            self.move_to(self.iterates[int(info["selected"])])
            self.selected = True
            return
        following = self.point - self.plan.lr * self.released(update)
        self.move_to(following)
        self.steps += 1
        self.iterates.append(following)
        if self.select == "last":
            self.iterates = self.iterates[-2:]

    @torch.no_grad()
    def finalize(self) -> None:
        """select last: w_T, the iterate whose gradient was released last (Theorem 4's output)."""
        if self.select == "last" and len(self.iterates) > 1:
            self.move_to(self.iterates[-2])

    def state_dict(self) -> dict:
        return {"iterates": [w.clone() for w in self.iterates], "selected": self.selected, "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.iterates = [w.clone() for w in state["iterates"]]
        self.selected, self.steps = bool(state["selected"]), int(state["steps"])


@OPTIMIZERS.register("kl_spider", "proximal_point", "adaptive_noisy_gd")
def _kl_optimizer(spec, directions, model=None, n_private=None):
    """The KL paper's optimizers run the plan their preset derived from the privacy budget."""
    import components.families.kl.plan as kl

    plan = kl.plan_for(spec, spec.public_rows(n_private), directions.dim, float(spec.mechanism.noise_multiplier))
    if spec.optimizer.kind == "kl_spider":
        return KlSpider(directions, plan)
    if spec.optimizer.kind == "proximal_point":
        return ProximalPoint(directions, plan)
    return AdaptiveNoisyGd(directions, plan, spec.optimizer.select)
