"""Adam (decoupled weight decay, torch.optim.AdamW) applied to estimator updates.

The estimator's update is the gradient estimate: seeded directions are regenerated into a dense
gradient tensor by tensor, dense terms added, and torch's AdamW takes its step. Everything it reads was
released through the mechanism, so its moments are post-processing.
"""
from __future__ import annotations

import copy
from typing import Sequence

import torch

from components.estimators.directions import Directions
from components.estimators.queries import Update
from components.registry import OPTIMIZERS


class Adam:
    def __init__(self, directions: Directions, lr: float, betas: Sequence[float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        self.directions = directions
        self.lr = lr
        # foreach=False: the same per-tensor arithmetic on every replica and device count, so Ray replicas
        # and a resumed run reproduce the driver's parameters exactly
        self._adam = torch.optim.AdamW(directions.params, lr=lr, betas=tuple(betas), eps=eps,
                                       weight_decay=weight_decay, foreach=False)

    @torch.no_grad()
    def apply(self, update: Update) -> None:
        for i, p in enumerate(self.directions.params):
            grad = torch.zeros_like(p)
            for seed, coef in update.terms:
                self.directions.add_to_(seed, i, grad, coef)
            for tensors, coef in update.dense:
                grad.add_(tensors[i], alpha=coef)
            p.grad = grad
        self._adam.step()
        for p in self.directions.params:
            p.grad = None

    def state_dict(self) -> dict:
        # a snapshot: torch hands out its live moment tensors, which the next step would change under a
        # checkpoint kept in memory (a retried chunk rewinds to it)
        return {"adam": copy.deepcopy(self._adam.state_dict())}

    def load_state_dict(self, state: dict) -> None:
        self._adam.load_state_dict(state["adam"])


@OPTIMIZERS.register("adam")
def _adam(spec, directions, model=None, n_private=None):
    opt = spec.optimizer
    return Adam(directions, opt.lr, opt.betas, opt.eps, opt.weight_decay)
