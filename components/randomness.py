"""The two kinds of randomness in privzo, kept apart (docs/design.md, "Privacy invariants" 2).

* Public randomness (directions, splits) is derived from the spec's ``seed`` and is reproducible.
* Private randomness (DP noise, Poisson batch selection) is seeded from OS entropy via ``secrets`` and
  shares no state with the public streams. Tests may inject a seeded generator explicitly; a spec gets
  one only through ``privacy.insecure_deterministic: true``, which labels the run not private.
* ``privacy.noise: secure`` replaces those generators by SecureSource: noise from OpenDP's exact
  discrete Gaussian, batches from ``secrets`` bits, both from cryptographically secure generators.
"""
from __future__ import annotations

import functools
import hashlib
import math
import os
import secrets
from typing import Optional

import numpy as np
import torch

from specs.traits import ESTIMATORS, SCALAR, SELECTION

_MASK63 = (1 << 63) - 1
_MASK64 = (1 << 64) - 1


def public_seed(seed: int, *path: int) -> int:
    """A 63-bit seed for the public stream named by ``path`` (e.g. (STREAM_DIRECTION, step, j)).

    BLAKE2b of the integers: well mixed, stable across platforms and versions, and cheap enough to call
    per tensor per step."""
    data = b"".join(int(v).to_bytes(16, "little", signed=True) for v in (seed, *path))
    return int.from_bytes(hashlib.blake2b(data, digest_size=8, person=b"privzo-public").digest(), "little") & _MASK63


def splitmix64(base: int, index: int) -> int:
    """splitmix64 of (base, index), 63 bits: a cheap, well-mixed seed for part ``index`` of the stream
    ``base`` (a direction's chunks on the CPU, its tensors' Philox keys on a GPU)."""
    z = (base + (index + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & _MASK63


# Names of public streams, as integers for SeedSequence spawn keys.
STREAM_SPLIT = 1
STREAM_DIRECTION = 2
STREAM_INIT = 3
STREAM_EXAMPLE_DIRECTION = 4  # per-example sphere directions of the nonsmooth oracles
STREAM_PASS = 5  # the order a single pass reads the private rows in
STREAM_REHEARSAL = 6  # which public rows a tune rehearsal holds out to score its settings
STREAM_INSECURE_PRIVATE = 99


def private_generator(insecure_seed: Optional[int] = None, device: str = "cpu") -> torch.Generator:
    """Generator for DP noise or batch selection.

    Seeded with 63 bits from ``secrets`` unless ``insecure_seed`` is given (tests and
    ``insecure_deterministic`` runs only). Each caller gets its own generator, so no public stream can
    advance or reveal it.
    """
    gen = torch.Generator(device=device)
    gen.manual_seed(secrets.randbits(63) if insecure_seed is None else insecure_seed)
    return gen


# ---------------------------------------------------------------- secure private randomness (privacy.noise)
# Which private source draws a run's noise and batches (privacy.noise): "secure" (below), "fast" (torch's
# Mersenne Twister seeded from `secrets`, as private_generator), or "seeded" (an injected generator or an
# insecure_deterministic run). The sentence says it in the run's privacy report.
NOISE_SENTENCES = {
    "secure": "DP noise was drawn by OpenDP's exact discrete Gaussian sampler from OpenSSL's CSPRNG (safe from "
              "floating-point attacks, Mironov 2012), and batch membership from the OS CSPRNG (secrets) by "
              "exact Bernoulli draws (Poisson) or a uniform permutation (fixed size).",
    "fast": "DP noise and batch membership were drawn by torch's generators (Mersenne Twister on the CPU, "
            "Philox on a GPU) seeded with 63 bits from the OS CSPRNG (secrets): fast, but not hardened "
            "against floating-point attacks (privacy.noise: secure is).",
    "seeded": "DP noise and batch membership were drawn from a generator seeded by the spec's seed "
              "(insecure_deterministic) or injected by a test: repeatable, NOT private.",
}

# privacy.noise: auto draws secure noise where bench/secure_noise.py measured it at most 2% of a step.
# A secure draw costs ~25-30 us of CPU (OpenDP's exact sampler), a fast one ~0.03 us. The estimators that
# release q scalars a step pay q draws against 2q forward passes of a batch, so the share falls with
# batch rows x model parameters: 3-7% on digits' MLP (64 x 9,610), 2-3% at 64 x 76,810, under 1% from
# 64 x 153,610 and 0.3% at 64 x 1.1M (the bench's --sizes). A d-dimensional release (dpgd_0th, first_order, gep) pays one draw per
# coordinate: 6x to 40x a digits step, so it is never the default there.
SECURE_MIN_ROW_PARAMETERS = 8_000_000  # expected batch rows x model parameters


def noise_source(requested: str, estimator_kind: str, *, private: bool, insecure: bool,
                 row_parameters: Optional[int] = None) -> str:
    """The source a run draws from: ``requested`` is privacy.noise (auto, secure or fast). auto is secure
    for an estimator that releases q scalars a step on a batch of at least SECURE_MIN_ROW_PARAMETERS
    ``row_parameters`` (expected batch rows x model parameters), fast otherwise. An insecure_deterministic
    run is seeded (the spec refuses noise: secure with it); a run without a mechanism has nothing to hide."""
    if insecure:
        return "seeded"
    if not private:
        return "fast"
    if requested == "auto":
        big = row_parameters is not None and row_parameters >= SECURE_MIN_ROW_PARAMETERS
        return "secure" if ESTIMATORS[estimator_kind].release in (SCALAR, SELECTION) and big else "fast"
    if requested not in ("secure", "fast"):
        raise ValueError(f"privacy.noise: unknown {requested!r}; allowed: auto, secure, fast")
    return requested


def secure_bernoulli(n: int, rate: float) -> np.ndarray:
    """``n`` independent booleans, each True with probability exactly ``rate``, from ``secrets``.

    A float is a dyadic rational num / 2^e, so U < rate for a uniform U in [0, 1) is decided exactly by
    comparing U's bits with rate's binary expansion: the first 16 bits of every draw at once (OS entropy
    costs a few ns a byte, so a row gets two), and the rare tie (probability 2^-16 per row) 64 bits at a
    time until the bits differ or rate's run out."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"secure_bernoulli: rate {rate} must be in [0, 1]")
    num, den = float(rate).as_integer_ratio()
    head = (num << 16) // den  # rate's first 16 bits; 2^16 when rate == 1 (every draw is below it)
    draws = np.frombuffer(secrets.token_bytes(2 * n), dtype="<u2").astype(np.int32)
    keep = draws < head
    for i in np.flatnonzero(draws == head):
        keep[i] = _below_tail((num << 16) - head * den, den)
    return keep


def _below_tail(rest: int, den: int) -> bool:
    """Whether a fresh uniform U in [0, 1) is below rest / den (den a power of two), 64 bits at a time."""
    while rest:
        block = (rest << 64) // den
        u = secrets.randbits(64)
        if u != block:
            return u < block
        rest = (rest << 64) - block * den
    return False  # rate's bits ran out on a tie: U >= rate (U == rate has probability 0)


def secure_subset(n: int, size: int) -> np.ndarray:
    """``size`` distinct indices of range(n), uniformly among all subsets, sorted: the first ``size`` of a
    uniform permutation, which orders the rows by independent 64-bit keys from ``secrets``. Keys that
    collide (probability < n^2 / 2^65) are all redrawn, so the permutation is exactly uniform."""
    while True:
        keys = np.frombuffer(secrets.token_bytes(8 * n), dtype="<u8")
        if len(np.unique(keys)) == n:
            return np.sort(np.argsort(keys)[:size])


_opendp = None


def _opendp_prelude():
    """OpenDP, imported on first use: loading its library takes seconds, and only secure runs need it."""
    global _opendp
    if _opendp is None:
        import opendp.prelude as dp

        dp.enable_features("contrib")  # make_gaussian is a contrib measurement (proof-documented, not vetted)
        _opendp = dp
    return _opendp


@functools.lru_cache(maxsize=64)
def _gaussian_measurement(size: int, scale: float, k: int):
    dp = _opendp_prelude()
    space = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=size), dp.l2_distance(T=float)
    return dp.m.make_gaussian(*space, scale=scale, k=k)


def secure_discrete_gaussian(size: int, scale: float, k: int) -> np.ndarray:
    """``size`` draws of the discrete Gaussian of scale ``scale`` on the grid 2^k Z, by OpenDP.

    OpenDP's Gaussian on floats rounds its input to the nearest multiple of 2^k, adds an exact discrete
    Gaussian (Canonne, Kamath, Steinke 2020) in integer arithmetic from OpenSSL's CSPRNG, and returns the
    nearest float. Its input here is 0, a multiple of every 2^k, so nothing is rounded on the way in; on the
    way out a multiple of 2^k below 2^(k+53) in magnitude is a float exactly, which is checked, so each
    value is the draw itself. The check depends on the noise alone, never on data; at the mechanism's grids
    (2^k <= scale * 2^-40, gaussian.GRID_BITS) the range exceeds 2^11 scales, so it fails with probability
    below e^-2000000."""
    if size == 0:
        return np.zeros(0)
    out = np.asarray(_gaussian_measurement(size, float(scale), int(k))([0.0] * size), dtype=np.float64)
    if not np.all(np.abs(out) < math.ldexp(1.0, k + 52)):
        raise RuntimeError("secure noise: a discrete Gaussian draw left the exactly representable range")
    return out


class _Refill:
    """One background thread for every secure source: OpenDP's sampler releases the GIL, so draws for later
    steps run beside this step's forward passes."""

    executor = None
    pid = None

    @classmethod
    def submit(cls, fn, *args):
        if cls.executor is None or cls.pid != os.getpid():  # a forked child has the object, not the thread
            from concurrent.futures import ThreadPoolExecutor

            cls.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="privzo-secure-noise")
            cls.pid = os.getpid()
        return cls.executor.submit(fn, *args)


class SecureGaussianPool:
    """Discrete Gaussian draws of one scale and grid, drawn ``block`` at a time ahead of use.

    The noise does not depend on the data, so drawing it early changes nothing in its distribution; the
    drawn values stay in this process (never in a checkpoint, log or message) and each is used once."""

    def __init__(self, scale: float, k: int, block: int = 256):
        self.scale, self.k, self.block = scale, k, block
        self._start()

    def _start(self) -> None:
        self._pid = os.getpid()
        self._ready = np.zeros(0)
        self._next = _Refill.submit(secure_discrete_gaussian, self.block, self.scale, self.k)

    def take(self, n: int) -> np.ndarray:
        if self._pid != os.getpid():
            self._start()  # a forked child never uses the draws its parent holds: noise is used once
        while len(self._ready) < n:
            self._ready = np.concatenate([self._ready, self._next.result()])
            self._next = _Refill.submit(secure_discrete_gaussian, max(self.block, n), self.scale, self.k)
        out, self._ready = self._ready[:n], self._ready[n:]
        return out


class SecureSource:
    """Private randomness from cryptographically secure generators, in place of a torch.Generator: the
    Gaussian mechanism draws its noise from OpenDP (components/mechanisms/gaussian.py), the samplers
    their batches from ``secrets``. It holds no seed and no state that could be saved or replayed."""

    kind = "secure"

    def members(self, n: int, rate: float) -> torch.Tensor:
        """The indices of the rows among ``n`` that join, each independently with probability ``rate``."""
        return torch.from_numpy(np.flatnonzero(secure_bernoulli(n, rate)))

    def subset(self, n: int, size: int) -> torch.Tensor:
        return torch.from_numpy(secure_subset(n, size))
