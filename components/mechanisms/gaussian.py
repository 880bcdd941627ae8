"""Gaussian mechanism on clipped per-example sums, and the explicit no-mechanism of non-private runs."""
from __future__ import annotations

import math
from fractions import Fraction
from typing import List, Sequence, Union

import dp_accounting
import numpy as np
import torch

from components.randomness import SecureGaussianPool, SecureSource, secure_discrete_gaussian
from components.registry import MECHANISMS, Assembly, mark_seeded
from components.accountants import OncePerRowTracker, PrivacyTracker

# Secure noise lives on the grid 2^k Z with 2^k <= std * 2^-GRID_BITS: fine enough that paying for rounding
# a release to it scales the std by at most 1 + 2^-40 ceil(sqrt(dims)) std / Delta, coarse enough that
# every draw up to 2^11 stds is a float exactly.
GRID_BITS = 40
DENSE_BLOCK = 1 << 15  # secure draws per OpenDP call for a d-dimensional release


def secure_grid_exponent(std: float) -> int:
    """k such that 2^k is the largest power of two <= std * 2^-GRID_BITS (exact, from the float's exponent)."""
    if not std > 0:
        raise ValueError(f"secure noise: std {std} must be > 0")
    k = math.frexp(std)[1] - 1 - GRID_BITS
    if k < -1000:  # below, grid points are subnormal and rounding to them is no longer exact
        raise ValueError(f"secure noise: std {std:g} is too small (at least 2^-960 is needed)")
    return k


def inflated_std(std: float, sensitivity: float, dims: int, k: int) -> float:
    """``std`` scaled up to pay for rounding ``dims`` coordinates to the grid 2^k.

    Rounding moves each coordinate by at most 2^k / 2, so two neighbouring inputs, at most ``sensitivity``
    apart in L2, are at most sensitivity + sqrt(dims) 2^k apart once rounded; the noise keeps its
    multiplier on that: std * (sensitivity + ceil(sqrt(dims)) 2^k) / sensitivity, computed exactly and
    rounded up to a float, so it is never below what the rounded inputs need."""
    root = math.isqrt(dims)
    root += root * root < dims
    exact = Fraction(std) * (Fraction(sensitivity) + root * Fraction(2) ** k) / Fraction(sensitivity)
    out = float(exact)
    return out if Fraction(out) >= exact else math.nextafter(out, math.inf)


def round_to_grid(values: torch.Tensor, k: int) -> torch.Tensor:
    """Each float64 value to the nearest multiple of 2^k (ties to even): exact, as dividing and multiplying
    by a power of two and rounding to an integer are; NaN and inf stay as they are."""
    grid = math.ldexp(1.0, k)
    return torch.round(values / grid) * grid


def _secure_draws(count: int, scale: float, k: int) -> torch.Tensor:
    parts = [secure_discrete_gaussian(min(DENSE_BLOCK, count - start), scale, k)
             for start in range(0, count, DENSE_BLOCK)]
    return torch.from_numpy(np.concatenate(parts) if parts else np.zeros(0))


def _secure_add(tensors: Sequence[torch.Tensor], std: float, sensitivity: float) -> List[torch.Tensor]:
    """Tensors that together have L2 sensitivity ``sensitivity``, each plus discrete Gaussian noise of
    (at least) ``std`` on the grid: rounded to the grid on the host in float64, plus the draws, then back
    to their device and dtype. Both terms are multiples of 2^k, so their float sum is the correctly rounded
    exact sum: a function of the discrete Gaussian mechanism's output, whatever the input's bits."""
    k = secure_grid_exponent(std)
    dims = sum(t.numel() for t in tensors)
    noise = _secure_draws(dims, inflated_std(std, sensitivity, dims, k), k)
    out, at = [], 0
    for t in tensors:
        host = round_to_grid(t.detach().to(device="cpu", dtype=torch.float64), k)
        out.append((host + noise[at:at + t.numel()].view(t.shape)).to(device=t.device, dtype=t.dtype))
        at += t.numel()
    return out


def _host(sums: torch.Tensor) -> torch.Tensor:
    """Query sums as float64 on the host, where the noise is drawn: a release is a few scalars, whatever
    device computed them."""
    return sums.detach().to(device="cpu", dtype=torch.float64)


class GaussianMechanism:
    """Adds N(0, (sqrt(Q) * sigma * Delta)^2) to each released coordinate, Q = noisy queries per step: a
    QueryReleases mechanism (components/protocols.py), the only door through which a step's clipped sums
    leave (docs/design.md, "One private step"). ``release_scalars`` takes the q scalar sums of finite differences
    or loss values, ``release_vector`` a d-dimensional sum, ``release_embedded`` GEP's pair.

    Delta = clip for add/remove neighbours and 2 * clip for replace-one. Releasing Q sums of one batch
    (possibly in adaptive rounds, as PAZO-S does) with per-coordinate std sqrt(Q) sigma Delta composes to a
    single Gaussian mechanism of multiplier sigma on a vector of L2 sensitivity sqrt(Q) Delta (Gaussian DP
    composition), so a step's DpEvent is GaussianDpEvent(sigma) for any Q. A d-dimensional release
    (DPGD-0th) is one query of L2 sensitivity Delta. Noise comes from the generator handed in (OS entropy
    unless a test injects one).

    Handed a SecureSource instead (privacy.noise: secure), the noise is OpenDP's exact discrete Gaussian
    from OpenSSL's CSPRNG, immune to the floating-point attacks on textbook samplers (Mironov 2012). Each
    release is rounded to the grid 2^k Z (2^k <= std * 2^-40) and the discrete Gaussian on that grid is
    added; rounding moves a coordinate by up to 2^(k-1), so the sensitivity grows by up to sqrt(dims) 2^k
    and the std is scaled up to cover it (inflated_std: by a factor 1 + ceil(sqrt(dims)) 2^k / Delta
    <= 1 + 2^-40 ceil(sqrt(dims)) std / Delta; for q scalars coordinate by coordinate), never down. Two
    rounded inputs differ by a vector on the grid, for which the discrete Gaussian's Renyi divergences are
    at most the continuous Gaussian's (Canonne, Kamath, Steinke 2020); and on a grid 2^-40 of its std it
    is the continuous Gaussian rounded to the grid up to a total variation of order 2^-80 per coordinate
    (the midpoint rule's error), so the accountant's subsampled-Gaussian analysis holds up to that: a
    delta of order T dims 2^-80 over T steps.
    """

    private = True

    def __init__(self, clip: float, noise_multiplier: float, queries_per_step: int, neighboring: str,
                 generator: Union[torch.Generator, SecureSource]):
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
        self.secure = isinstance(generator, SecureSource)
        self.noise_source = "secure" if self.secure else "fast"  # builders.build_loop says "seeded" when it is
        self._pool = None
        if self.secure:
            # q scalars a step: one coordinate's sensitivity is Delta; draws start now, in the background
            self._scalar_k = secure_grid_exponent(self.std)
            self._pool = SecureGaussianPool(inflated_std(self.std, self.sensitivity, 1, self._scalar_k),
                                            self._scalar_k, block=max(256, 16 * queries_per_step))

    def use_generator(self, generator: torch.Generator) -> None:
        """Draw from ``generator`` from now on (an insecure_deterministic run restarts its stream per chunk)."""
        self._generator = generator
        self._device_generators = {}
        self.secure, self.noise_source, self._pool = False, "seeded", None

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

    def release_scalars(self, sums: torch.Tensor) -> torch.Tensor:
        """The step's q scalar query sums, each plus N(0, std^2), as float64 on the host."""
        if sums.dim() != 1 or not 0 < len(sums) <= self.queries:
            raise ValueError(f"release_scalars: expected 1..{self.queries} query sums, got shape {tuple(sums.shape)}")
        if self.secure:
            # q scalars: numpy's float64 arithmetic is torch's (IEEE, correctly rounded), with less overhead
            grid = math.ldexp(1.0, self._scalar_k)
            return torch.from_numpy(np.round(_host(sums).numpy() / grid) * grid + self._pool.take(len(sums)))
        noise = torch.randn(len(sums), generator=self._generator, dtype=torch.float64)
        return _host(sums) + self.std * noise

    def release_vector(self, tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        """A d-dimensional clipped sum plus N(0, std^2 I_d), tensor by tensor."""
        if self.secure:
            return _secure_add(list(tensors), self.std, self.sensitivity)
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
        if self.secure:
            # each part's std covers its own rounding, so in noise units neither moves further than assumed
            released = _secure_add([_host(embedding)], embedding_std, self.sensitivity)[0]
            return released, _secure_add(list(residual), residual_std, self.sensitivity * residual_clip / self.clip)
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
    """Releases exact, unclipped values: the run is not private (MeZO). Accounted as NonPrivateDpEvent.
    The same release methods as GaussianMechanism, so the loop's door is the same for both."""

    private = False
    clip = math.inf
    std = 0.0
    # no noise is drawn; "fast" is what the privacy report has always said for mechanism none (it names the
    # mechanism none in its own words, whatever this says)
    noise_source = "fast"

    def __init__(self, queries_per_step: int):
        self.queries = queries_per_step

    def use_generator(self, generator) -> None:
        pass  # draws nothing

    def release_scalars(self, sums: torch.Tensor) -> torch.Tensor:
        return _host(sums)

    def release_vector(self, tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        return list(tensors)

    def release_embedded(self, embedding: torch.Tensor, residual: Sequence[torch.Tensor], residual_clip: float,
                         embedding_share: float):
        return _host(embedding), list(residual)

    def step_event(self) -> dp_accounting.DpEvent:
        return dp_accounting.NonPrivateDpEvent()


@MECHANISMS.register("gaussian")
def _gaussian(spec, parts: Assembly):
    """One Gaussian release of the step's queries, amplified by the sampler and composed per step; a single
    pass (the one-shot zeroth-order oracle) releases each row in one Gaussian of its whole vector."""
    sigma = float(spec.mechanism.noise_multiplier)
    if spec.sampling.kind == "single_pass":
        mechanism = GaussianMechanism(spec.mechanism.clip * math.sqrt(parts.directions.dim), sigma, 1,
                                      spec.privacy.neighboring, parts.noise_generator)
        mark_seeded(mechanism, parts)
        return mechanism, OncePerRowTracker(parts.accountant, mechanism.step_event(), parts.delta)
    mechanism = GaussianMechanism(spec.mechanism.clip, sigma, parts.estimator.queries_per_step,
                                  spec.privacy.neighboring, parts.noise_generator)
    mark_seeded(mechanism, parts)
    return mechanism, PrivacyTracker(parts.accountant, parts.sampler.wrap(mechanism.step_event()), parts.delta)


@MECHANISMS.register("none")
def _none(spec, parts: Assembly):
    """No noise, no clip: a non-private twin (epsilon = inf). A SPIDER oracle's twin keeps its running sums,
    restarted every period."""
    from components.mechanisms.tree import NoiselessTree
    from specs.traits import ESTIMATORS

    if ESTIMATORS[spec.estimator.kind].running_sums:
        mechanism = NoiselessTree(parts.estimator.period)
    else:
        mechanism = NoMechanism(parts.estimator.queries_per_step)
    return mechanism, PrivacyTracker(parts.accountant, mechanism.step_event(), 0.0)
