"""O2NC: online-to-nonconvex conversion (Cutkosky, Mehta and Orabona 2023), as the two nonsmooth papers (Zhang et al.; Kornowski et al.) run it.

An online learner, projected online gradient descent on the ball {|Delta| <= D} with the linear losses
<g_t, .>, picks each step's increment; the iterate moves by it, and the next gradient is queried at a point
a uniformly random fraction s of the way along the move. Averages of query points over windows of W steps
(W D <= r keeps a window inside a ball of radius r) are the candidate outputs; the algorithm's guarantee is
for the average of a window k* drawn uniformly.

    Delta_1 = 0; x_0 given
    for t = 1..T:
        x_t = x_(t-1) + Delta_t;  z_t = x_(t-1) + s_t Delta_t        (s_t ~ U[0, 1], public)
        g_t = oracle(z_t)
        Delta_(t+1) = min(1, D / |Delta_t - eta g_t|) (Delta_t - eta g_t)
    output the average of z over window k* ~ U{1..floor(T / W)}

``restart_every`` (Zhang et al., Algorithm 3: an epoch is a window) sets Delta back to 0 at every window's
start, so each epoch's first query point is the iterate itself. The s_t and k* come from the public seed:
they are independent of the data, as the privacy proofs condition on them.

The model's parameters always hold the next query point z_t: the oracle (a forward-only estimator) reads
them as it reads any model. The iterate x and the increment Delta are the optimizer's state (public: a
function of x_0, public randomness and earlier releases), as is the running sum of the output window.
"""
from __future__ import annotations

import math
from typing import Callable, List, Optional

import numpy as np
import torch

from components.directions import Directions
from components.queries import Update
from components.optimizers.sgd import gradient_into
from components.registry import OPTIMIZERS


class O2nc:
    def __init__(self, directions: Directions, step_bound: float, lr: float, window: int, steps: int, seed: int,
                 restart_every: Optional[int] = None,
                 smoothed_gradient: Optional[Callable[[np.ndarray], np.ndarray]] = None):
        if not (step_bound > 0 and math.isfinite(step_bound)):
            raise ValueError(f"optimizer.step_bound: {step_bound} must be a finite number > 0")
        if not (lr > 0 and math.isfinite(lr)):
            raise ValueError(f"optimizer.lr: {lr} must be a finite number > 0")
        if not 1 <= window <= steps:
            raise ValueError(f"optimizer.window: {window} must be between 1 and the {steps} steps")
        if restart_every is not None and restart_every != window:
            raise ValueError(f"optimizer.restart_every: {restart_every} must equal the window ({window}): "
                             "Zhang et al.'s epochs are its windows")
        self.directions = directions
        self.step_bound = float(step_bound)
        self.lr = float(lr)
        self.window = int(window)
        self.steps = int(steps)
        self.restart = restart_every is not None
        self.windows = self.steps // self.window
        rng = np.random.default_rng(seed)
        self.output_window = int(rng.integers(1, self.windows + 1))  # k*, drawn before the run
        self._rng_seed = int(seed)
        params = directions.params
        self._x = [p.detach().clone() for p in params]  # x_(t-1): where the current move started
        self._delta = [torch.zeros_like(p) for p in params]  # Delta_t (Delta_1 = 0: z_1 = x_0)
        self._window_sum = [torch.zeros_like(p, dtype=torch.float64) for p in params]
        self._previous: Optional[List[torch.Tensor]] = None  # z_(t-1), for the oracle's difference
        # the window certificate (a synthetic problem's exact smoothed gradient at every query point): the
        # current window's sum of grad F_r, and Gamma_k of every window completed
        self._smoothed_gradient = smoothed_gradient
        self._certificate_sum: Optional[np.ndarray] = None
        self.certificates: List[float] = []
        self.step = 0  # gradients applied so far; the parameters hold z_(step + 1)
        self._add_query_point()  # z_1 = x_0
        self._advance_iterate()

    # the query point's fraction for step t: a pure function of (seed, t), so a resume reproduces it
    def _fraction(self, t: int) -> float:
        return float(np.random.default_rng([self._rng_seed, t]).random())

    def _window_of(self, t: int) -> int:
        return (t - 1) // self.window + 1

    def _add_query_point(self) -> None:
        t = self.step + 1
        if self._window_of(t) == self.output_window:
            for acc, p in zip(self._window_sum, self.directions.params):
                acc.add_(p.detach().double())
        if self._smoothed_gradient is not None and t <= self.windows * self.window:
            point = np.concatenate([p.detach().double().cpu().numpy().ravel() for p in self.directions.params])
            gradient = self._smoothed_gradient(point)
            self._certificate_sum = gradient if (t - 1) % self.window == 0 else self._certificate_sum + gradient
            if t % self.window == 0:
                self.certificates.append(float(np.linalg.norm(self._certificate_sum / self.window)))

    def certificate(self) -> Optional[float]:
        """The mean of Gamma_k over the windows completed so far: an upper bound, in expectation over the
        output window k*, on the Goldstein subgradient norm of the population objective at 2r around the
        output (None without an exact oracle or before a window completes)."""
        return float(np.mean(self.certificates)) if self.certificates else None

    def offset_to_previous(self) -> Optional[List[torch.Tensor]]:
        """z_(t-1) - z_t, the previous query point from the one the parameters hold (None at the first)."""
        if self._previous is None:
            return None
        return [q - p.detach() for q, p in zip(self._previous, self.directions.params)]

    def _advance_iterate(self) -> None:
        """x_(t-1) + Delta_t becomes the start of the next move."""
        for x, d in zip(self._x, self._delta):
            x.add_(d)

    @torch.no_grad()
    def apply(self, update: Update) -> None:
        """g_t (the update's terms, the released noisy gradient at z_t) in; z_(t+1) into the parameters."""
        params = self.directions.params
        self.step += 1
        t = self.step + 1  # the step whose query point is written now
        if self.restart and (t - 1) % self.window == 0:
            moved = [torch.zeros_like(d) for d in self._delta]  # a new epoch: OSD restarts at 0
        else:
            moved = [d - self.lr * gradient_into(self.directions, i, update, torch.zeros_like(d))
                     for i, d in enumerate(self._delta)]
        norm = math.sqrt(sum(float(m.double().pow(2).sum()) for m in moved))
        factor = 1.0 if norm <= self.step_bound else self.step_bound / norm
        self._delta = [m * factor for m in moved]
        s = self._fraction(t)
        self._previous = [p.detach().clone() for p in params]
        for p, x, d in zip(params, self._x, self._delta):
            p.copy_(x + s * d)
        self._add_query_point()
        self._advance_iterate()

    def increment_norm(self) -> float:
        return math.sqrt(sum(float(d.double().pow(2).sum()) for d in self._delta))

    @torch.no_grad()
    def finalize(self) -> None:
        """The output: the average of window k*'s query points into the parameters (once the run is done)."""
        if self.step + 1 < self.output_window * self.window:
            raise RuntimeError(f"o2nc: the output window {self.output_window} ends at step "
                               f"{self.output_window * self.window}; only {self.step + 1} query points were made")
        for p, acc in zip(self.directions.params, self._window_sum):
            p.copy_((acc / self.window).to(p.dtype))

    def state_dict(self) -> dict:
        return {"x": [x.clone() for x in self._x], "delta": [d.clone() for d in self._delta],
                "window_sum": [w.clone() for w in self._window_sum], "step": self.step,
                "output_window": self.output_window,
                "previous": None if self._previous is None else [q.clone() for q in self._previous],
                "certificates": list(self.certificates),
                "certificate_sum": None if self._certificate_sum is None else torch.from_numpy(
                    np.array(self._certificate_sum))}

    def load_state_dict(self, state: dict) -> None:
        params = self.directions.params

        def moved(tensors: List[torch.Tensor], like, dtype=None):
            return [t.to(device=p.device, dtype=dtype or p.dtype).clone() for t, p in zip(tensors, like)]

        self._x = moved(state["x"], params)
        self._delta = moved(state["delta"], params)
        self._window_sum = moved(state["window_sum"], params, torch.float64)
        self.step = int(state["step"])
        self.output_window = int(state["output_window"])
        previous = state.get("previous")
        self._previous = None if previous is None else moved(previous, params)
        self.certificates = [float(c) for c in state.get("certificates", [])]
        total = state.get("certificate_sum")
        self._certificate_sum = None if total is None else total.numpy().copy()


@OPTIMIZERS.register("o2nc")
def _o2nc(spec, directions, model=None, n_private=None):
    opt = spec.optimizer
    oracle = None
    if getattr(model, "objective", None) == "w_linear":
        from components.families.nonsmooth.problems import smoothed_gradient

        radius = spec.estimator.radius
        oracle = lambda z: smoothed_gradient(z, radius)  # noqa: E731 (exact, public: F = h reads no row)
    return O2nc(directions, opt.step_bound, opt.lr, opt.window, opt.steps, spec.seed,
                restart_every=opt.window if opt.restart else None, smoothed_gradient=oracle)
