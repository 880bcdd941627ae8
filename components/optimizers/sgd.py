"""SGD with momentum and (coupled, L2) weight decay for estimator updates.

Seeded terms of an update are applied by regenerating each direction tensor from its seed (nothing
d-sized is kept without momentum); dense terms (public gradients, PAZO-P/S directions, DPGD-0th's noisy
vector) are added as they are. Momentum needs one d-sized buffer: the velocity is dense by nature.
"""
from __future__ import annotations

from typing import List, Optional

import torch

from components.estimators.directions import Directions
from components.estimators.queries import Update
from components.registry import OPTIMIZERS


def gradient_into(directions: Directions, i: int, update: Update, out: torch.Tensor) -> torch.Tensor:
    """out += tensor ``i`` of the update's gradient (its seeded terms, then its dense ones)."""
    for seed, coef in update.terms:
        directions.add_to_(seed, i, out, coef)
    for tensors, coef in update.dense:
        out.add_(tensors[i], alpha=coef)
    return out


class Sgd:
    def __init__(self, directions: Directions, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        self.directions = directions
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay
        self._velocity: Optional[List[torch.Tensor]] = None

    @torch.no_grad()
    def apply(self, update: Update) -> None:
        params = self.directions.params
        if self.momentum == 0.0:
            # per tensor: decay, then the seeded terms in order, then the dense ones (whole directions at
            # a time, so a GPU updates every tensor in one launch per term)
            if self.weight_decay:
                for p in params:
                    p.mul_(1.0 - self.lr * self.weight_decay)
            for seed, coef in update.terms:
                self.directions.add_all_(seed, -self.lr * coef)
            for tensors, coef in update.dense:
                for i, p in enumerate(params):
                    p.add_(tensors[i], alpha=-self.lr * coef)
            return
        if self._velocity is None:
            self._velocity = [torch.zeros_like(p) for p in params]
        for i, (p, v) in enumerate(zip(params, self._velocity)):
            grad = gradient_into(self.directions, i, update, torch.zeros_like(p))
            if self.weight_decay:
                grad.add_(p, alpha=self.weight_decay)
            v.mul_(self.momentum).add_(grad)
            p.add_(v, alpha=-self.lr)

    def state_dict(self) -> dict:
        return {"velocity": None if self._velocity is None else [v.clone() for v in self._velocity]}

    def load_state_dict(self, state: dict) -> None:
        vel = state.get("velocity")
        self._velocity = None if vel is None else [
            v.to(device=p.device, dtype=p.dtype).clone() for v, p in zip(vel, self.directions.params)]


def replay(directions: Directions, journal, lr: float, momentum: float = 0.0, weight_decay: float = 0.0) -> None:
    """Re-apply a journal of (step, seed, coefficient) entries to ``directions.params`` in place:
    x_T = replay(x_0, journal) for estimators whose updates are purely seeded (two_point, MeZO). Uses the
    same arithmetic as training, so the result is bit-identical."""
    opt = Sgd(directions, lr, momentum, weight_decay)
    by_step: dict = {}
    for entry in journal:
        by_step.setdefault(entry.step, []).append((entry.seed, entry.coefficient))
    for step in sorted(by_step):
        opt.apply(Update(terms=tuple(by_step[step])))


@OPTIMIZERS.register("sgd")
def _sgd(spec, directions, model=None, n_private=None):
    opt = spec.optimizer
    return Sgd(directions, opt.lr, opt.momentum, opt.weight_decay)
