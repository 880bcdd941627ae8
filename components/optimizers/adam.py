"""Adam (decoupled weight decay, torch.optim.AdamW) applied to estimator updates.

The estimator's update is the gradient estimate: seeded directions are regenerated into a dense
gradient tensor by tensor, dense terms added, and torch's AdamW takes its step. Everything it reads was
released through the mechanism, so its moments are post-processing.
"""
from __future__ import annotations

import copy
from typing import Sequence

import torch

from components.directions import Directions
from components.queries import Update
from components.optimizers.sgd import MasterWeights, add_direction_, master_weights
from components.registry import OPTIMIZERS


class Adam:
    def __init__(self, directions: Directions, lr: float, betas: Sequence[float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, master_weights: bool = False):
        self.directions = directions
        self.lr = lr
        self.master = MasterWeights(directions.params) if master_weights else None
        if self.master is not None and not self.master.active:
            self.master = None
        # AdamW steps the float32 master copies where there are some (their moments float32 too)
        targets = self.master.allocate() if self.master is not None else directions.params
        # foreach=False: the same per-tensor arithmetic on every replica and device count, so Ray replicas
        # and a resumed run reproduce the driver's parameters exactly
        self._adam = torch.optim.AdamW(targets, lr=lr, betas=tuple(betas), eps=eps,
                                       weight_decay=weight_decay, foreach=False)

    @torch.no_grad()
    def apply(self, update: Update) -> None:
        targets = self.master.begin_step() if self.master is not None else self.directions.params
        for i, t in enumerate(targets):
            grad = torch.zeros_like(t)
            for seed, coef in update.terms:
                add_direction_(self.directions, seed, i, grad, coef)
            for tensors, coef in update.dense:
                grad.add_(tensors[i].to(grad.dtype), alpha=coef)
            t.grad = grad
        self._adam.step()
        for t in targets:
            t.grad = None
        if self.master is not None:
            self.master.round_into_parameters()

    def state_dict(self) -> dict:
        # a snapshot: torch hands out its live moment tensors, which the next step would change under a
        # checkpoint kept in memory (a retried chunk rewinds to it)
        state = {"adam": copy.deepcopy(self._adam.state_dict())}
        if self.master is not None:
            state["master"] = self.master.state()
        return state

    def load_state_dict(self, state: dict) -> None:
        if self.master is not None:
            with torch.no_grad():
                self.master.load(state.get("master"))
        self._adam.load_state_dict(state["adam"])


@OPTIMIZERS.register("adam")
def _adam(spec, directions, model=None, n_private=None):
    opt = spec.optimizer
    return Adam(directions, opt.lr, opt.betas, opt.eps, opt.weight_decay, master_weights(spec))
