"""Public random directions regenerated from integer seeds, one parameter tensor at a time.

A direction u is never stored whole: tensor i of direction ``seed`` is regenerated from
``public_seed(seed, i)`` whenever it is needed (MeZO's memory trick). Because each tensor has its own
stream, tensors can be produced in any order (module hooks, replicas, replays) with identical values.
"""
from __future__ import annotations

import contextlib
import math
from collections import OrderedDict
from typing import Iterator, List, Optional

import torch
from torch import nn

from components.randomness import public_seed


class Directions:
    """Directions over a fixed list of parameter tensors.

    kinds: ``gaussian`` (N(0, I_d), E[uu^T] = I), ``rademacher`` (+-1 entries, E[uu^T] = I),
    ``sphere`` (uniform on radius * S^{d-1}; radius sqrt(d) gives E[uu^T] = I as in DPZero).
    """

    def __init__(self, params: List[torch.Tensor], kind: str = "gaussian", radius: Optional[float] = None):
        if kind not in ("gaussian", "sphere", "rademacher"):
            raise ValueError(f"estimator.directions: unknown {kind!r}; allowed: gaussian, sphere, rademacher")
        self.params = list(params)
        self.kind = kind
        self.dim = sum(p.numel() for p in self.params)
        self.radius = math.sqrt(self.dim) if radius is None else float(radius)
        self._norms: "OrderedDict[int, float]" = OrderedDict()  # seed -> ||z|| for the sphere (scalars only)
        self._cache: dict = {}  # seed -> list of tensors, only inside ``cached``

    @contextlib.contextmanager
    def cached(self, seeds) -> Iterator[None]:
        """Cache mode: generate each direction once (one RNG pass) and reuse it for the +lambda and -lambda
        points and the update, at the price of d extra numbers per direction kept for the step."""
        for seed in seeds:
            self._cache[seed] = [self._generate(seed, i) for i in range(len(self.params))]
        try:
            yield
        finally:
            self._cache.clear()

    def _raw(self, seed: int, i: int) -> torch.Tensor:
        p = self.params[i]
        gen = torch.Generator(device=p.device)
        gen.manual_seed(public_seed(seed, i))
        if self.kind == "rademacher":
            z = torch.randint(0, 2, p.shape, generator=gen, device=p.device, dtype=torch.int8)
            return z.to(p.dtype).mul_(2).sub_(1)
        return torch.randn(p.shape, generator=gen, device=p.device, dtype=p.dtype)

    def _sphere_norm(self, seed: int) -> float:
        norm = self._norms.get(seed)
        if norm is None:
            # one extra generation pass, in float64, to get ||z|| over the whole direction
            norm = math.sqrt(sum(float(self._raw(seed, i).double().square().sum()) for i in range(len(self.params))))
            self._norms[seed] = norm
            if len(self._norms) > 256:
                self._norms.popitem(last=False)
        return norm

    def tensor(self, seed: int, i: int) -> torch.Tensor:
        """Tensor ``i`` of direction ``seed`` (do not modify it: in cache mode it is shared)."""
        cached = self._cache.get(seed)
        if cached is not None:
            return cached[i]
        return self._generate(seed, i)

    def _generate(self, seed: int, i: int) -> torch.Tensor:
        z = self._raw(seed, i)
        if self.kind == "sphere":
            z.mul_(self.radius / self._sphere_norm(seed))
        return z

    def iter_tensors(self, seed: int) -> Iterator[torch.Tensor]:
        for i in range(len(self.params)):
            yield self.tensor(seed, i)

    def dense(self, seed: int) -> List[torch.Tensor]:
        """The whole direction materialised (tests and cache mode only)."""
        return list(self.iter_tensors(seed))


def direction_tensor(directions: Directions, direction, i: int) -> torch.Tensor:
    """Tensor ``i`` of a ``Seeded``/``Dense`` direction (a bare int is a seed)."""
    if isinstance(direction, int):
        return directions.tensor(direction, i)
    seed = getattr(direction, "seed", None)
    if seed is not None:
        return directions.tensor(seed, i)
    return direction.tensor(i)


def add_direction_(directions: Directions, seed: int, scale: float) -> None:
    """In place: x <- x + scale * u(seed). Used for updates (not for the +-lambda query points)."""
    with torch.no_grad():
        for i, p in enumerate(directions.params):
            p.add_(directions.tensor(seed, i), alpha=scale)


@contextlib.contextmanager
def perturbed(model: nn.Module, directions: Directions, direction, scale: float) -> Iterator[None]:
    """Run the model's forward passes at x + scale * v without writing x (v: a seed, ``Seeded`` or ``Dense``).

    Each module's own parameters are swapped for ``p + scale * z`` just before that module runs and
    swapped back right after, so at most one module's perturbed tensors exist at a time (memory of
    inference + one parameter tensor) and the parameters are restored bit for bit: x itself is never
    modified, unlike MeZO's in-place +lambda, -2lambda, +lambda, which drifts by rounding in floating
    point.
    """
    index = {id(p): i for i, p in enumerate(directions.params)}
    handles = []
    swapped: List[tuple] = []

    def make_hooks(owned):
        def pre(module, _args):
            for name, p in owned:
                module._parameters[name] = torch.add(
                    p.detach(), direction_tensor(directions, direction, index[id(p)]), alpha=scale)
                swapped.append((module, name, p))

        def post(module, _args, _out):
            for name, p in owned:
                module._parameters[name] = p

        return pre, post

    for module in model.modules():
        owned = [(n, p) for n, p in module._parameters.items() if p is not None and id(p) in index]
        if owned:
            pre, post = make_hooks(owned)
            handles.append(module.register_forward_pre_hook(pre))
            handles.append(module.register_forward_hook(post))
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        for h in handles:
            h.remove()
        for module, name, p in swapped:  # restore even if a forward raised half way
            module._parameters[name] = p
    if swapped and not failed:
        seen = {id(p) for _, _, p in swapped}
        missed = [i for i, p in enumerate(directions.params) if id(p) not in seen]
        if missed:
            # a parameter read outside its own module's forward would be evaluated unperturbed and bias
            # the finite differences silently; refuse instead
            raise RuntimeError(
                f"perturbed forward: {len(missed)} trainable parameter tensor(s) (first: #{missed[0]}) were not "
                "used through their own module's forward; freeze unused parameters (requires_grad=False)")
