"""The two kinds of randomness in privzo, kept apart (DESIGN §4 rule 2).

* Public randomness (directions, splits) is derived from the spec's ``seed`` and is reproducible.
* Private randomness (DP noise, Poisson batch selection) is seeded from OS entropy via ``secrets`` and
  shares no state with the public streams. Tests may inject a seeded generator explicitly; a spec gets
  one only through ``privacy.insecure_deterministic: true``, which labels the run not private.
"""
from __future__ import annotations

import secrets
from typing import Optional

import numpy as np
import torch

_MASK63 = (1 << 63) - 1


def public_seed(seed: int, *path: int) -> int:
    """A 63-bit seed for the public stream named by ``path`` (e.g. ("direction", step, j) as ints)."""
    state = np.random.SeedSequence(entropy=int(seed), spawn_key=tuple(int(p) for p in path)).generate_state(2, np.uint64)
    return int((int(state[0]) << 32 ^ int(state[1])) & _MASK63)


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
