"""Tree aggregation: noisy running sums of a period's per-step increments, and their exact accounting.

The private nonsmooth algorithms (O2NC with a variance-reduced oracle, the two nonsmooth papers (Zhang et al.; Kornowski et al.)) release, at
every step p = 1..period of a period, the running sum S_p = v_1 + ... + v_p of that period's increments
plus tree noise. privzo releases exactly one node per position, the Fenwick node
node(b) = [b - lowbit(b) + 1, b] (lowbit(b) = b & -b), each carrying a fresh xi_b ~ N(0, std^2 I_d) drawn
at step b, and

    release(p) = S_p + sum of xi_b over chain(p),   chain(p) = {p, p - lowbit(p), ...} (down to 0).

So every prefix, the period's last included, carries popcount(p) node noises: the papers' TREE(t mod Σ)
released the whole prefix at t = 0 mod Σ with none; positions here run 1..period and
the tree is fresh every period. The un-noised running sum and the live node noises (knowing one de-noises a
release) live only inside this object: nothing reads them, and a checkpoint may only be taken between
periods, when both are empty (``at_boundary``).

Accounting: an example used at position i enters exactly the released nodes whose interval holds i,
``node_count(i, period)`` of them (position 1 is in floor(log2 period) + 1 = J, every other position in at
most J - 1). Given the earlier releases each of those nodes moves by at most the step's sensitivity Delta
and every other node not at all, so a single pass over the data is the adaptive composition of J Gaussian
mechanisms of multiplier std / Delta: ``tree_event``. Never 2 ln n, which is below J for n in {1, 2, 4}.
An example that can land in two leaves of one tree (Poisson or fixed-size sampling, a resumed partial
period) multiplies its node sensitivity: such runs are refused where specs are checked.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence

import dp_accounting
import numpy as np
import torch


def lowbit(b: int) -> int:
    return b & -b


def chain(p: int) -> List[int]:
    """The released nodes whose noise position ``p``'s prefix carries: p, p - lowbit(p), ... (all > 0)."""
    if p < 1:
        raise ValueError(f"tree: position {p} must be >= 1")
    out = []
    while p > 0:
        out.append(p)
        p -= lowbit(p)
    return out


def node_interval(b: int) -> tuple:
    """The positions node ``b`` sums: [b - lowbit(b) + 1, b]."""
    return b - lowbit(b) + 1, b


def tree_depth(period: int) -> int:
    """J = floor(log2 period) + 1: the most released nodes any one position is in (position 1's count)."""
    if period < 1:
        raise ValueError(f"tree: period {period} must be >= 1")
    return period.bit_length()


def node_count(i: int, period: int) -> int:
    """How many of a period's released nodes hold position ``i``: the nodes b <= period with
    b - lowbit(b) < i <= b. Level l holds i when bit l of i - 1 is 0 and that level's node ending above i
    still lies inside the period."""
    if not 1 <= i <= period:
        raise ValueError(f"tree: position {i} must be in 1..{period}")
    count = 0
    for level in range(tree_depth(period)):
        if not (i - 1) >> level & 1 and ((i - 1) // 2 ** level + 1) * 2 ** level <= period:
            count += 1
    return count


def node_counts(period: int) -> List[int]:
    return [node_count(i, period) for i in range(1, period + 1)]


def tree_event(noise_multiplier: float, period: int, passes: int = 1) -> dp_accounting.DpEvent:
    """The run's DpEvent for a worst-case example: J Gaussian releases of multiplier std / Delta for every
    pass over the data (each pass puts each example in one leaf of one period's tree). Equal in RDP to
    dp-accounting's SingleEpochTreeAggregationDpEvent, which only its RDP accountant takes and only under
    REPLACE_SPECIAL; this form works with rdp, pld and zcdp under privzo's relations."""
    if not noise_multiplier > 0:
        raise ValueError(f"tree: noise multiplier {noise_multiplier} must be > 0")
    if passes < 1:
        raise ValueError(f"tree: passes {passes} must be >= 1")
    return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(noise_multiplier),
                                             passes * tree_depth(period))


class TreeAggregation:
    """Noisy running sums over periods of ``period`` steps (see the module docstring): a RunningSumReleases
    and Periodic mechanism (components/protocols.py), the only door through which a tree run's increments
    leave (docs/design.md, "One private step").

    ``release_running_sum(increment)`` takes step p's increment (tensors of a d-dimensional clipped,
    batch-normalised sum whose L2 sensitivity is ``sensitivity``) and returns the released prefix
    S_p + TREE(p). ``std`` is the node noise, noise_multiplier * sensitivity, drawn in float64 on the host from the generator handed in
    (OS entropy unless a test injects one). The discrete-Gaussian secure source is not offered here yet:
    its exactness argument (sums of grid points) has not been made for prefixes of many nodes."""

    private = True
    # what the backend is told to clip with: a tree's queries carry their own clips (checked at the door
    # against ``sensitivity``), so this only needs to be finite
    clip = 1.0
    noise_source = "fast"
    neighbour_factor = 2.0  # a single pass's batches partition the rows: replace-one only

    def __init__(self, period: int, noise_multiplier: float, sensitivity: float, generator: torch.Generator):
        tree_depth(period)
        if not (noise_multiplier > 0 and sensitivity > 0):
            raise ValueError("tree: noise_multiplier and sensitivity must be > 0")
        if not isinstance(generator, torch.Generator):
            raise ValueError("privacy.noise: secure is not available with tree aggregation yet; use fast")
        self.period = period
        self.noise_multiplier = noise_multiplier
        self.sensitivity = sensitivity
        self.std = noise_multiplier * sensitivity
        self._generator = generator
        self._position = 0
        self._sum: Optional[List[torch.Tensor]] = None  # the un-noised S_p, never released
        self._live: Dict[int, List[torch.Tensor]] = {}  # xi_b for b on the chain of the last position

    @property
    def position(self) -> int:
        """The last position released in the current period (0 at a period boundary)."""
        return self._position

    @property
    def at_boundary(self) -> bool:
        """Between periods: no un-noised sum and no live noise held, the only time a checkpoint may be taken."""
        return self._position == 0

    def release_running_sum(self, increment: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        increment = [t.detach().to(torch.float64) for t in increment]
        p = self._position + 1
        if p == 1:
            self._sum = [torch.zeros_like(t) for t in increment]
        elif [t.shape for t in increment] != [t.shape for t in self._sum]:
            raise ValueError("tree: an increment's shapes differ from the period's first")
        for s, t in zip(self._sum, increment):
            s.add_(t)
        self._live[p] = [self.std * torch.randn(t.shape, generator=self._generator, dtype=torch.float64)
                         .to(t.device) for t in increment]
        nodes = chain(p)
        # only the chain of p is ever carried again (a later prefix's chain runs through it)
        self._live = {b: self._live[b] for b in nodes}
        released = [s + sum(self._live[b][j] for b in nodes) for j, s in enumerate(self._sum)]
        self._position = p
        if p == self.period:  # a fresh tree next period: nothing of this one is reused
            self._position, self._sum, self._live = 0, None, {}
        return released

    def reset(self) -> None:
        """Drop the current period's un-noised sum and live noise (a run rewound to a period boundary
        starts a fresh tree; the rows of the aborted period are not read again)."""
        self._position, self._sum, self._live = 0, None, {}

    def use_generator(self, generator: torch.Generator) -> None:
        self._generator = generator
        self.noise_source = "seeded"

    def event(self, passes: int = 1) -> dp_accounting.DpEvent:
        return tree_event(self.noise_multiplier, self.period, passes)


class NoiselessTree:
    """The running sums of a period's increments with no noise and no clipping: the non-private twin of a
    tree run (mechanism none), for measuring what the noise costs. Released through the same door
    (RunningSumReleases, Periodic) as the private run's."""

    private = False
    clip = math.inf
    std = 0.0
    noise_source = "fast"  # draws no noise; as NoMechanism, what the report has always said for mechanism none

    def __init__(self, period: int):
        tree_depth(period)
        self.period = period
        self._position = 0
        self._sum: Optional[List[torch.Tensor]] = None

    @property
    def at_boundary(self) -> bool:
        return self._position == 0

    def release_running_sum(self, increment: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        increment = [t.detach().to(torch.float64) for t in increment]
        if self._position == 0:
            self._sum = [torch.zeros_like(t) for t in increment]
        for s, t in zip(self._sum, increment):
            s.add_(t)
        released = [s.clone() for s in self._sum]
        self._position = 0 if self._position + 1 == self.period else self._position + 1
        return released

    def reset(self) -> None:
        self._position, self._sum = 0, None

    def use_generator(self, generator) -> None:
        pass  # draws nothing

    def step_event(self) -> dp_accounting.DpEvent:
        return dp_accounting.NonPrivateDpEvent()


def released_nodes(releases: Sequence[np.ndarray]) -> List[np.ndarray]:
    """The node values behind a period's releases x_1..x_p: y_b = x_b - x_(b - lowbit(b)) (x_0 = 0), the
    bijection the accounting composes over."""
    out = []
    for b in range(1, len(releases) + 1):
        before = b - lowbit(b)
        out.append(np.asarray(releases[b - 1]) - (np.asarray(releases[before - 1]) if before else 0.0))
    return out
