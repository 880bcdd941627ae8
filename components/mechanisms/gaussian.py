"""Gaussian mechanism on clipped per-example sums, and the explicit no-mechanism of non-private runs."""
from __future__ import annotations

import math
from typing import List, Sequence

import dp_accounting
import torch


def _host(sums: torch.Tensor) -> torch.Tensor:
    """Query sums as float64 on the host, where the noise is drawn: a release is a few scalars, whatever
    device computed them."""
    return sums.detach().to(device="cpu", dtype=torch.float64)


class GaussianMechanism:
    """Adds N(0, (sqrt(Q) * sigma * Delta)^2) to each released coordinate, Q = noisy queries per step.

    Delta = clip for add/remove neighbours and 2 * clip for replace-one. Releasing Q sums of one batch
    (possibly in adaptive rounds, as PAZO-S does) with per-coordinate std sqrt(Q) sigma Delta composes to a
    single Gaussian mechanism of multiplier sigma on a vector of L2 sensitivity sqrt(Q) Delta (Gaussian DP
    composition), so a step's DpEvent is GaussianDpEvent(sigma) for any Q. A d-dimensional release
    (DPGD-0th) is one query of L2 sensitivity Delta. Noise comes from the generator handed in (OS entropy
    unless a test injects one).
    """

    private = True

    def __init__(self, clip: float, noise_multiplier: float, queries_per_step: int, neighboring: str,
                 generator: torch.Generator):
        if clip <= 0 or noise_multiplier <= 0 or queries_per_step < 1:
            raise ValueError("gaussian mechanism: clip and noise_multiplier must be > 0, queries >= 1")
        if neighboring not in ("add_remove", "replace_one"):
            raise ValueError(f"privacy.neighboring: unknown {neighboring!r}; allowed: add_remove, replace_one")
        self.clip = clip
        self.noise_multiplier = noise_multiplier
        self.queries = queries_per_step
        self.sensitivity = clip * (2.0 if neighboring == "replace_one" else 1.0)
        self.std = math.sqrt(queries_per_step) * noise_multiplier * self.sensitivity
        self._generator = generator
        self._device_generators: dict = {}

    def use_generator(self, generator: torch.Generator) -> None:
        """Draw from ``generator`` from now on (an insecure_deterministic run restarts its stream per chunk)."""
        self._generator = generator
        self._device_generators = {}

    def _dense_generator(self, device: torch.device) -> torch.Generator:
        """Where the d-dimensional noise is drawn: on the host, or on the parameters' GPU by a generator
        seeded with 63 bits drawn from the host noise generator (private like it, and as repeatable when a
        test or an insecure_deterministic run fixes that one's seed)."""
        if device.type == "cpu":
            return self._generator
        gen = self._device_generators.get(device)
        if gen is None:
            seed = int(torch.randint(0, 2**63 - 1, (1,), generator=self._generator, dtype=torch.int64))
            gen = self._device_generators[device] = torch.Generator(device=device)
            gen.manual_seed(seed)
        return gen

    def release(self, sums: torch.Tensor) -> torch.Tensor:
        if sums.dim() != 1 or not 0 < len(sums) <= self.queries:
            raise ValueError(f"release: expected 1..{self.queries} query sums, got shape {tuple(sums.shape)}")
        noise = torch.randn(len(sums), generator=self._generator, dtype=torch.float64)
        return _host(sums) + self.std * noise

    def release_dense(self, tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        """A d-dimensional clipped sum plus N(0, std^2 I_d), tensor by tensor."""
        out = []
        for t in tensors:
            noise = torch.randn(t.shape, generator=self._dense_generator(t.device), dtype=torch.float64,
                                device=t.device)
            out.append((t.double() + self.std * noise).to(dtype=t.dtype))
        return out

    def release_embedded(self, embedding: torch.Tensor, residual: Sequence[torch.Tensor], residual_clip: float,
                         embedding_share: float):
        """GEP's two clipped sums as one Gaussian query of multiplier sigma. The embedding (per-example
        clip = clip) gets std / sqrt(share) per coordinate and the residual (per-example clip =
        residual_clip) std * (residual_clip / clip) / sqrt(1 - share): in units of its noise one example moves
        the pair by at most sqrt(share + (1 - share)) / sigma = 1 / sigma, exactly one Gaussian of multiplier
        sigma, whatever the share and the residual clip."""
        if not (0 < embedding_share < 1 and residual_clip > 0):
            raise ValueError("release_embedded: embedding_share must be in (0, 1) and residual_clip > 0")
        embedding_std = self.std / math.sqrt(embedding_share)
        residual_std = self.std * (residual_clip / self.clip) / math.sqrt(1.0 - embedding_share)
        noise = torch.randn(embedding.shape, generator=self._generator, dtype=torch.float64)
        released = _host(embedding) + embedding_std * noise
        out = []
        for t in residual:
            noise = torch.randn(t.shape, generator=self._dense_generator(t.device), dtype=torch.float64,
                                device=t.device)
            out.append((t.double() + residual_std * noise).to(dtype=t.dtype))
        return released, out

    def step_event(self) -> dp_accounting.DpEvent:
        return dp_accounting.GaussianDpEvent(self.noise_multiplier)


class NoMechanism:
    """Releases exact, unclipped values: the run is not private (MeZO). Accounted as NonPrivateDpEvent."""

    private = False
    clip = math.inf
    std = 0.0

    def __init__(self, queries_per_step: int):
        self.queries = queries_per_step

    def release(self, sums: torch.Tensor) -> torch.Tensor:
        return _host(sums)

    def release_dense(self, tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        return list(tensors)

    def release_embedded(self, embedding: torch.Tensor, residual: Sequence[torch.Tensor], residual_clip: float,
                         embedding_share: float):
        return _host(embedding), list(residual)

    def step_event(self) -> dp_accounting.DpEvent:
        return dp_accounting.NonPrivateDpEvent()
