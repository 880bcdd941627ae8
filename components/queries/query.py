"""What an estimator asks of the private data, as plain values a backend (local or remote) can evaluate.

A direction in parameter space is either ``Seeded`` (a public random direction regenerated from its seed)
or ``Dense`` (explicit tensors, e.g. a public gradient or a combination of them). A query lists the
points at which every private example's loss is evaluated; the backend clips each per-example value and
returns only the sums.
"""
from __future__ import annotations

from dataclasses import dataclass
import math
from typing import Optional, Tuple, Union

import torch


@dataclass(frozen=True)
class Seeded:
    seed: int


@dataclass(frozen=True, eq=False)
class Dense:
    tensors: Tuple[torch.Tensor, ...]

    def tensor(self, i: int) -> torch.Tensor:
        return self.tensors[i]


Direction = Union[Seeded, Dense]


@dataclass(frozen=True)
class FiniteDifferences:
    """Per example and per direction v: (f(x + lambda v) - f(x - lambda v)) / (2 lambda). Sums: one per v."""

    directions: Tuple[Direction, ...]
    smoothing: float

    @property
    def size(self) -> int:
        return len(self.directions)


@dataclass(frozen=True)
class LossValues:
    """Per example and per point: f(x + scale * v). Sums: one per point (PAZO-S candidates)."""

    points: Tuple[Tuple[Direction, float], ...]

    @property
    def size(self) -> int:
        return len(self.points)


@dataclass(frozen=True)
class VectorFiniteDifferences:
    """DPGD-0th: per example the d-dimensional estimate g_i = (1/q) sum_j a_ij v_j, clipped in L2 norm.

    The backend returns the clipped sum in the basis of the directions (q coefficients); the mechanism
    adds d-dimensional noise to the vector they describe, so the coefficients themselves never leave
    unnoised.
    """

    directions: Tuple[Seeded, ...]
    smoothing: float

    @property
    def size(self) -> int:
        return len(self.directions)


@dataclass(frozen=True, eq=False)
class PerExampleGradients:
    """DP-SGD: per example the gradient of its loss over every trainable parameter, clipped in L2 norm
    (all parameters together), summed. The backend returns one tensor per parameter; the mechanism adds
    d-dimensional noise to them, as for DPGD-0th. Not forward-only: it needs a backward pass.

    ``center`` (public, one tensor per parameter; DOPE-SGD): what is clipped is g_i - center, so the clip
    ball sits around the center instead of the origin. One example still moves the sum by at most the
    clip, so the release is the same Gaussian query."""

    center: Optional[Tuple[torch.Tensor, ...]] = None

    @property
    def size(self) -> int:
        return 1


@dataclass(frozen=True, eq=False)
class EmbeddedGradients:
    """GEP: per example, the gradient g_i split by a public orthonormal basis B [k, d] (rows in the
    parameters' order, flattened) into its embedding w_i = B g_i and residual r_i = g_i - B^T w_i; w_i is
    clipped to the mechanism's clip and r_i to ``residual_clip``, each in L2, and both are summed. The
    mechanism noises the two sums so that together they are one Gaussian query of multiplier sigma
    (``embedding_share`` of the privacy goes to the embedding). Not forward-only."""

    basis: torch.Tensor
    residual_clip: float
    embedding_share: float

    @property
    def size(self) -> int:
        return 1


SPHERE_KINDS = ("central", "one_sided_difference", "central_difference", "independent_difference")


@dataclass(frozen=True, eq=False)
class PerExampleSphere:
    """The nonsmooth algorithms' oracles (the two nonsmooth papers (Zhang et al.; Kornowski et al.)): every example gets its own ``directions``
    directions u_ij on the sphere of radius sqrt(d), drawn from public_seed(seed, slot) where slot is the
    example's place in the step's batch (``first_slot`` onward: a worker holding part of the batch draws
    the same directions as one process holding all of it). With ``keyed_by_row`` the slot is instead a
    keyed digest of the example's own content, so its directions do not depend on which rows share its
    batch: under add/remove neighbours (Poisson batches) an added row must move no other row's term, which
    places in the batch would (every later row shifts). Per example i, with lambda = ``smoothing``, p the
    parameters and q = p + ``offset`` (the previous query point):

        central:              c_ij = (f(p + lambda u) - f(p - lambda u)) / (2 lambda)        (001 GRAD, 002 start)
        one_sided_difference: c_ij = (f(p + lambda u) - f(q + lambda u)) / lambda            (001 DIFF)
        central_difference:   c_ij = central at p - central at q, same u                     (002 coupled difference)

    and g_i = (1/m) sum_j c_ij u_ij; or, for independent_difference (002's difference as its paper has it),
    g_i = (1/m) sum_j central_ij(p) u_ij - (1/m) sum_j central_ij(q) u_i(m+j): 2m directions per example,
    the first m at p and the others at q. ``clip_mode`` scalar clamps every c_ij to +-clip (so |g_i| <= clip
    sqrt(d)); vector clips g_i to L2 norm clip. The backend returns the sum of the g_i, one tensor per
    parameter, float64: a d-dimensional release."""

    kind: str
    directions: int
    seed: int
    smoothing: float
    clip_mode: str
    clip: float
    offset: Optional[Tuple[torch.Tensor, ...]] = None
    first_slot: int = 0
    keyed_by_row: bool = False

    def __post_init__(self):
        if self.kind not in SPHERE_KINDS:
            raise ValueError(f"sphere query: unknown kind {self.kind!r}; allowed: {', '.join(SPHERE_KINDS)}")
        if self.clip_mode not in ("scalar", "vector"):
            raise ValueError(f"sphere query: clip_mode {self.clip_mode!r}; allowed: scalar, vector")
        if (self.offset is None) != (self.kind == "central"):
            raise ValueError("sphere query: a difference needs the offset to the previous point, central none")

    @property
    def size(self) -> int:
        return 1

    def vector_bound(self, dimension: int) -> float:
        """The most one example's g_i can measure in L2."""
        return self.clip * math.sqrt(dimension) if self.clip_mode == "scalar" else self.clip


BALL_KINDS = ("gradient", "gradient_difference")


@dataclass(frozen=True, eq=False)
class PerExampleBall(PerExampleSphere):
    """Kornowski, Liu and Talwar's first-order oracle (its Algorithm 5): every example gets its own points y_ij uniform in the
    unit ball, drawn from public_seed(seed, slot) as for a sphere query, and its loss's gradient is taken at
    p + ``smoothing`` y_ij (``smoothing`` is the ball's radius alpha). Per example i:

        gradient:            g_i = (1/m) sum_{j <= m} grad f(p + alpha y_ij)                     (a period start)
        gradient_difference: g_i = (1/m) sum_{j <= m} grad f(p + alpha y_ij)
                                   - (1/m) sum_{m < j <= 2m} grad f(q + alpha y_ij)                (q = p + offset)

    with m = ``directions``: the two points of a difference get independent perturbations (coupling them
    does not help a nonsmooth loss, whose gradient jumps across a kink). g_i is clipped in L2 to ``clip``
    and the backend returns the sum, one float64 tensor per parameter. Not forward-only: it needs a
    backward pass per perturbed point."""

    def __post_init__(self):
        if self.kind not in BALL_KINDS:
            raise ValueError(f"ball query: unknown kind {self.kind!r}; allowed: {', '.join(BALL_KINDS)}")
        if self.clip_mode != "vector":
            raise ValueError(f"ball query: clip_mode {self.clip_mode!r}; allowed: vector")
        if (self.offset is None) != (self.kind == "gradient"):
            raise ValueError("ball query: a difference needs the offset to the previous point, a gradient none")


EXACT_KINDS = ("gradient", "gradient_difference")


@dataclass(frozen=True, eq=False)
class PerExampleGradientAt(PerExampleSphere):
    """Menart et al. (KL)'s full-batch first-order oracle: per example i, with p the parameters,

        gradient:            g_i = grad f(p + offset; x_i)    (offset None: at p)
        gradient_difference: g_i = grad f(p; x_i) - grad f(p + offset; x_i)

    clipped in L2 to ``clip``; the backend returns the sum, one float64 tensor per parameter. No random
    points: ``directions`` is 1 and ``smoothing`` 0. Not forward-only."""

    def __post_init__(self):
        if self.kind not in EXACT_KINDS:
            raise ValueError(f"gradient query: unknown kind {self.kind!r}; allowed: {', '.join(EXACT_KINDS)}")
        if self.clip_mode != "vector":
            raise ValueError(f"gradient query: clip_mode {self.clip_mode!r}; allowed: vector")
        if self.kind == "gradient_difference" and self.offset is None:
            raise ValueError("gradient query: a difference needs the offset to the other point")

    @classmethod
    def at(cls, kind: str, clip: float, offset=None) -> "PerExampleGradientAt":
        return cls(kind, 1, 0, 0.0, "vector", float(clip), None if offset is None else tuple(offset))


Query = Union[FiniteDifferences, LossValues, VectorFiniteDifferences, PerExampleGradients, EmbeddedGradients,
              PerExampleSphere]

# queries released as one d-dimensional vector (a single Gaussian query of L2 sensitivity = clip)
DENSE_QUERIES = (VectorFiniteDifferences, PerExampleGradients, EmbeddedGradients, PerExampleSphere)


@dataclass(frozen=True, eq=False)
class Update:
    """x <- x - lr * (sum coefficient * u(seed) + sum coefficient * dense)."""

    terms: Tuple[Tuple[int, float], ...] = ()
    dense: Tuple[Tuple[Tuple[torch.Tensor, ...], float], ...] = ()
    # public values an optimizer reads beside the update (the KL paper's selected iterate)
    info: Tuple[Tuple[str, float], ...] = ()
