"""In-process backend: the model replica and the private rows live in this process.

A backend answers ``query``: per-example values at the estimator's perturbed points, clipped per
example and summed. Only those clipped sums leave it; the caller adds the noise.
"""
from __future__ import annotations

import torch
from torch import nn

from components.estimators.directions import Directions
from components.estimators.two_point import StepPlan, ZoUpdate
from components.mechanisms.gaussian import clip_sum
from components.models import per_example_loss


class LocalBackend:
    def __init__(self, model: nn.Module, directions: Directions, optimizer, features: torch.Tensor,
                 labels: torch.Tensor, estimator):
        self.model = model.eval()  # no dropout or batch statistics: both forward passes see one function
        self.directions = directions
        self.optimizer = optimizer
        self.estimator = estimator
        self._features = features
        self._labels = labels

    @property
    def n_private(self) -> int:
        return len(self._labels)

    def query(self, plan: StepPlan, indices: torch.Tensor, clip: float) -> torch.Tensor:
        x, y = self._features[indices], self._labels[indices]
        values = self.estimator.private_values(self.model, self.directions, per_example_loss, x, y, plan)
        return clip_sum(values, clip)

    def apply(self, update: ZoUpdate) -> None:
        self.optimizer.apply(update)

    def state_dict(self) -> dict:
        return {"model": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
                "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
