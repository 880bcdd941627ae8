"""In-process backend: the model replica and the private rows live in this process.

A backend (components.protocols.Backend) answers ``query``: per-example values at the estimator's queried
points, clipped per example and summed. Only those clipped sums leave it; the caller adds the noise.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from components.directions import Directions
from components.queries.clipped_sums import evaluate_query
from components.queries import Query, Update
from components.models import per_example_loss
from components.protocols import Optimizer


class LocalBackend:
    def __init__(self, model: nn.Module, directions: Directions, optimizer: Optimizer, features: torch.Tensor,
                 labels: torch.Tensor, cache_directions: bool = False, prefetch_directions: bool = False,
                 persons: torch.Tensor | None = None):
        self.model = model.eval()  # no dropout or batch statistics: both forward passes see one function
        self.directions = directions
        self.optimizer = optimizer
        self.cache_directions = cache_directions
        self.prefetch_directions = cache_directions and prefetch_directions
        self._features = features
        self._labels = labels
        # a person-level run: each private row's person, so a query clips each person's summed rows
        self._persons = persons

    @property
    def n_private(self) -> int:
        return len(self._labels)

    @contextlib.contextmanager
    def step_scope(self, seeds, ahead=()):
        """Cache mode keeps the step's directions for its queries and its update; regenerate keeps none.
        With prefetch, ``ahead`` (the next step's seeds) is drawn in the background meanwhile."""
        if not (self.cache_directions and seeds):
            yield
            return
        with self.directions.cached(seeds):
            if self.prefetch_directions and ahead:
                self.directions.prefetch(ahead)
            yield

    def query(self, query: Query, indices: torch.Tensor, clip: float) -> torch.Tensor:
        x, y = self._features[indices], self._labels[indices]
        groups = None if self._persons is None else self._persons[indices]
        return evaluate_query(self.model, self.directions, per_example_loss, x, y, query, clip, groups)

    def apply(self, update: Update) -> None:
        self.optimizer.apply(update)

    def sync(self) -> None:
        """Nothing to push: this process's replica is the only one."""

    def close(self) -> None:
        """Nothing to give back: the replica and the rows go with this object."""

    def state_dict(self) -> dict:
        return {"model": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
                "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
