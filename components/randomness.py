"""The two kinds of randomness in privzo, kept apart (DESIGN §4 rule 2).

* Public randomness (directions, splits) is derived from the spec's ``seed`` and is reproducible.
* Private randomness (DP noise, Poisson batch selection) is seeded from OS entropy via ``secrets`` and
  shares no state with the public streams. Tests may inject a seeded generator explicitly; a spec gets
  one only through ``privacy.insecure_deterministic: true``, which labels the run not private.
"""
from __future__ import annotations

import hashlib
import secrets
from typing import Optional

import torch

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
