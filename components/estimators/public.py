"""Public data: seeded public batches, public gradients by backprop, and public warm start.

Public rows need no privacy, so everything here is ordinary first-order training, reproducible from the
run's seed.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np
import torch
from torch import nn

from components.queries.clipped_sums import per_example_gradient_matrix
from components.randomness import public_seed

STREAM_PUBLIC_BATCH = 4
STREAM_WARM_START = 5


def too_few_public_rows(k: int, size: int, n_public: int) -> Optional[str]:
    """The refusal of k disjoint public batches of ``size`` rows from ``n_public`` rows, or None."""
    if k * size <= n_public:
        return None
    return (f"estimator: {k} public batches of {size} rows need {k * size} public rows, the split has {n_public}; "
            "lower estimator.public_batch_size (or public_batches), or raise data.split.public")


class PublicOracle:
    def __init__(self, model: nn.Module, params: List[torch.Tensor], loss, features: torch.Tensor,
                 labels: torch.Tensor, seed: int):
        self.model = model
        self.params = params
        self.loss = loss
        self.features = features
        self.labels = labels
        self.seed = seed

    def __len__(self) -> int:
        return len(self.labels)

    def batches(self, step: int, k: int, size: int) -> List[torch.Tensor]:
        """k pairwise disjoint public batches of ``size`` rows for this step (no duplicated candidates)."""
        problem = too_few_public_rows(k, size, len(self))
        if problem:
            raise ValueError(problem)
        order = np.random.default_rng(public_seed(self.seed, STREAM_PUBLIC_BATCH, step)).permutation(len(self))
        return [torch.as_tensor(order[j * size:(j + 1) * size], device=self.features.device) for j in range(k)]

    def gradient(self, indices: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """Gradient of the mean public loss on ``indices`` at the current parameters."""
        with torch.enable_grad():
            loss = self.loss(self.model, self.features[indices], self.labels[indices]).mean()
            grads = torch.autograd.grad(loss, self.params, allow_unused=True)
        return tuple(torch.zeros_like(p) if g is None else g.detach() for p, g in zip(self.params, grads))


    def per_example_gradients(self, indices: torch.Tensor) -> torch.Tensor:
        """[rows, d]: each public row's own loss gradient at the current parameters, flattened in the
        parameters' order."""
        return per_example_gradient_matrix(self.model, self.params, self.loss, self.features[indices],
                                           self.labels[indices]).detach()


def warm_start(model: nn.Module, params: List[torch.Tensor], loss, features: torch.Tensor, labels: torch.Tensor,
               *, epochs: float, lr: float, batch_size: int, seed: int) -> int:
    """Plain minibatch SGD on public rows only (no privacy cost). Returns the number of steps taken. Weights
    below float32 (bf16 / fp16) are stepped through float32 copies, rounded into them after each step: an
    update under half a unit in the last place would otherwise be lost (model.master_weights' reason)."""
    n = len(labels)
    if n == 0:
        raise ValueError("estimator.public_warm_start: the public split is empty")
    steps = max(1, int(round(epochs * n / batch_size)))
    rng = np.random.default_rng(public_seed(seed, STREAM_WARM_START))
    order: List[int] = []
    masters = [p.detach().float() if p.dtype in (torch.bfloat16, torch.float16) else None for p in params]
    for _ in range(steps):
        if len(order) < batch_size:
            order += rng.permutation(n).tolist()
        idx = torch.as_tensor(order[:batch_size], device=features.device)
        del order[:batch_size]
        with torch.enable_grad():
            batch_loss = loss(model, features[idx], labels[idx]).mean()
            grads = torch.autograd.grad(batch_loss, params)
        with torch.no_grad():
            for p, g, master in zip(params, grads, masters):
                if master is None:
                    p.add_(g, alpha=-lr)
                else:
                    p.copy_(master.add_(g.float(), alpha=-lr))
    return steps
