"""SGD with momentum and (coupled, L2) weight decay for estimator updates.

Seeded terms of an update are applied by regenerating each direction tensor from its seed (nothing
d-sized is kept without momentum); dense terms (public gradients, PAZO-P/S directions, DPGD-0th's noisy
vector) are added as they are. Momentum needs one d-sized buffer: the velocity is dense by nature.
"""
from __future__ import annotations

from typing import List, Optional

import torch

from components.directions import Directions
from components.queries import Update
from components.registry import OPTIMIZERS


LOW_PRECISION = (torch.bfloat16, torch.float16)


def add_direction_(directions: Directions, seed: int, i: int, target: torch.Tensor, alpha: float) -> None:
    """target += alpha * u_i(seed), u drawn in its parameter's dtype: a float32 master copy of a bf16 parameter
    is moved along the very direction the perturbed forward passes used (drawn in bf16), upcast exactly."""
    if target.dtype == directions.params[i].dtype:
        directions.add_to_(seed, i, target, alpha)
    else:
        target.add_(directions.tensor(seed, i).to(target.dtype), alpha=alpha)


def gradient_into(directions: Directions, i: int, update: Update, out: torch.Tensor) -> torch.Tensor:
    """out += tensor ``i`` of the update's gradient (its seeded terms, then its dense ones)."""
    for seed, coef in update.terms:
        add_direction_(directions, seed, i, out, coef)
    for tensors, coef in update.dense:
        out.add_(tensors[i].to(out.dtype), alpha=coef)
    return out


class MasterWeights:
    """Float32 copies of the bf16 / fp16 trainable parameters (None for the others), which the optimizer
    updates, each rounded into its parameter after every step: an update below half a unit in the last place
    of a bf16 weight (most of a zeroth-order run's, at its small learning rates) would otherwise be lost to
    rounding. The copies are taken from the parameters at the first step (after any initialisation from a
    registered version or public warm start), so a replay from the same start makes the same copies; after
    that they are the optimizer's state (checkpoints, Ray workers)."""

    def __init__(self, params):
        self.params = list(params)
        self.copies: Optional[list] = None
        self.pending = True  # the copies are taken from the parameters at the next step

    @property
    def active(self) -> bool:
        return any(p.dtype in LOW_PRECISION for p in self.params)

    def allocate(self) -> list:
        """What a step updates (each parameter's float32 copy, or the parameter itself), allocated once: an
        optimizer that holds these tensors (AdamW) keeps them, and the first step refills them in place."""
        if self.copies is None:
            self.copies = [p.detach().float().clone() if p.dtype in LOW_PRECISION else None for p in self.params]
        return [p if c is None else c for p, c in zip(self.params, self.copies)]

    def begin_step(self) -> list:
        targets = self.allocate()
        if self.pending:
            for p, c in zip(self.params, self.copies):
                if c is not None:
                    c.copy_(p)
            self.pending = False
        return targets

    def round_into_parameters(self) -> None:
        for p, c in zip(self.params, self.copies or ()):
            if c is not None:
                p.copy_(c)

    def state(self):
        return None if self.pending else [None if c is None else c.clone() for c in self.copies]

    def load(self, copies) -> None:
        """Copies saved by ``state`` (None: none taken yet, so the next step takes them from the parameters)."""
        if copies is None:
            self.pending = True
            return
        for c, saved in zip(self.allocate(), copies):
            if saved is not None:
                c.copy_(saved)  # in place: an optimizer may hold these tensors
        self.pending = False


class Sgd:
    def __init__(self, directions: Directions, lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                 master_weights: bool = False):
        self.directions = directions
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay
        self._velocity: Optional[List[torch.Tensor]] = None
        self.master = MasterWeights(directions.params) if master_weights else None
        if self.master is not None and not self.master.active:
            self.master = None  # float32 parameters are their own masters

    @torch.no_grad()
    def apply(self, update: Update) -> None:
        if self.master is not None:
            self._apply_to(self.master.begin_step(), update)
            self.master.round_into_parameters()
            return
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

    def _apply_to(self, targets: list, update: Update) -> None:
        """The step on ``targets`` (the float32 master copies, or the parameters where those are float32), with
        the arithmetic of the plain step, tensor by tensor."""
        if self._velocity is None and self.momentum:
            self._velocity = [torch.zeros_like(t) for t in targets]
        for i, t in enumerate(targets):
            if self.momentum == 0.0:
                if self.weight_decay:
                    t.mul_(1.0 - self.lr * self.weight_decay)
                for seed, coef in update.terms:
                    add_direction_(self.directions, seed, i, t, -self.lr * coef)
                for tensors, coef in update.dense:
                    t.add_(tensors[i].to(t.dtype), alpha=-self.lr * coef)
                continue
            grad = gradient_into(self.directions, i, update, torch.zeros_like(t))
            if self.weight_decay:
                grad.add_(t, alpha=self.weight_decay)
            self._velocity[i].mul_(self.momentum).add_(grad)
            t.add_(self._velocity[i], alpha=-self.lr)

    def state_dict(self) -> dict:
        state = {"velocity": None if self._velocity is None else [v.clone() for v in self._velocity]}
        if self.master is not None:
            state["master"] = self.master.state()
        return state

    def load_state_dict(self, state: dict) -> None:
        vel = state.get("velocity")
        # the velocity lives beside what is updated: float32 with master copies
        dtypes = [torch.float32 if self.master is not None and p.dtype in LOW_PRECISION else p.dtype
                  for p in self.directions.params]
        self._velocity = None if vel is None else [
            v.to(device=p.device, dtype=d).clone() for v, p, d in zip(vel, self.directions.params, dtypes)]
        if self.master is not None:
            self.master.load(state.get("master"))


def replay(directions: Directions, journal, lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
           master_weights: bool = False) -> None:
    """Re-apply a journal of (step, seed, coefficient) entries to ``directions.params`` in place:
    x_T = replay(x_0, journal) for estimators whose updates are purely seeded (two_point, MeZO). Uses the
    same arithmetic as training (its master copies too), so the result is bit-identical."""
    opt = Sgd(directions, lr, momentum, weight_decay, master_weights)
    by_step: dict = {}
    for entry in journal:
        by_step.setdefault(entry.step, []).append((entry.seed, entry.coefficient))
    for step in sorted(by_step):
        opt.apply(Update(terms=tuple(by_step[step])))


@OPTIMIZERS.register("sgd")
def _sgd(spec, directions, model=None, n_private=None):
    opt = spec.optimizer
    return Sgd(directions, opt.lr, opt.momentum, opt.weight_decay, master_weights(spec))


def master_weights(spec) -> bool:
    """Whether low-precision trainable parameters are updated through float32 copies (model.master_weights,
    on the kinds that have a precision)."""
    return bool(getattr(spec.model, "master_weights", False))
