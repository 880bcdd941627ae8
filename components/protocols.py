"""What the private loop relies on from each part it is assembled from (docs/design.md, "One private step").

The loop (components/runtime/loop.py) is handed a backend, a sampler, an estimator, a mechanism and a
tracker, and reaches the optimizer through the backend. Each protocol below states the methods and
attributes the loop, the builders and the checkpoints actually use; nothing inherits from them.

A part that can do more than its protocol asks says so by matching a small capability protocol
(``isinstance(x, Periodic)``), never by the loop probing for a method name. Where every implementation
can carry a method at no cost (a local backend's ``sync``, a tracker's ``align``), it does, and no check
is needed.

Kept free of privzo imports (typing and torch only) so that every module may import it without an import
circle (docs/design.md, "Layers"). Values of privzo's own types are written ``Any`` with the type named in
a comment: Query and Update are in components/queries/query.py, Directions in
components/directions/engine.py, StepContext in components/runtime/loop.py.
"""
from __future__ import annotations

from typing import Any, ContextManager, List, Optional, Protocol, Sequence, Tuple, runtime_checkable

import torch

Tensors = List[torch.Tensor]  # one tensor per trainable parameter, in the parameters' order


# ------------------------------------------------------------------ estimators
@runtime_checkable
class Estimator(Protocol):
    """Turns released values into an update. It sees private data only through the step's context, whose
    doors release noisy values and count them against ``queries_per_step``."""

    name: str
    queries_per_step: int  # noisy queries a step may release: what the mechanism was calibrated for

    def direction_seeds(self, step: int, seed: int) -> Tuple[int, ...]:
        """The step's public direction seeds (a function of the public seed, so they may be drawn early)."""
        ...

    def step(self, ctx: Any) -> Any:
        """One step: queries through ``ctx`` (a StepContext), returns the Update to apply."""
        ...


# ------------------------------------------------------------------ mechanisms
@runtime_checkable
class Mechanism(Protocol):
    """The only door through which private values leave (docs/design.md, "One private step" and "Privacy
    invariants"): every value derived from private rows is released by one of its ``release*`` methods,
    with the noise its accounting assumes, or not at all.

    Every mechanism also states ``private`` (False only for the non-private twins of mechanism none),
    ``clip`` (what the backend clips per example with; infinite when nothing is clipped), ``noise_source``
    (the privacy report's name for what drew the noise: secure, fast or seeded) and ``use_generator``
    (an insecure_deterministic run restarts the noise stream per chunk)."""

    private: bool
    clip: float
    noise_source: str

    def use_generator(self, generator: torch.Generator) -> None: ...


@runtime_checkable
class QueryReleases(Mechanism, Protocol):
    """Releases a step's clipped query sums (GaussianMechanism, and NoMechanism exactly): ``release`` for the
    scalar sums of finite differences or loss values, ``release_vector`` for a d-dimensional sum,
    ``release_embedded`` for GEP's embedding and residual together."""

    def release_scalars(self, sums: torch.Tensor) -> torch.Tensor: ...

    def release_vector(self, tensors: Sequence[torch.Tensor]) -> Tensors: ...

    def release_embedded(self, embedding: torch.Tensor, residual: Sequence[torch.Tensor], residual_clip: float,
                         embedding_share: float) -> Tuple[torch.Tensor, Tensors]: ...


@runtime_checkable
class RunningSumReleases(Mechanism, Protocol):
    """Releases the running sum of a period's batch-normalised increments (tree aggregation, the scheduled
    Gaussians, and their noiseless twin); the un-noised sum never leaves. A private one also states
    ``sensitivity``, the L2 sensitivity of its next release, and ``neighbour_factor`` (2 under replace-one,
    1 under add/remove): the door checks each query's per-example bound against them."""

    def release_running_sum(self, increment: Sequence[torch.Tensor]) -> Tensors: ...


@runtime_checkable
class FullBatchReleases(Mechanism, Protocol):
    """Menart et al. (KL)'s releases on the mean over every private row: a Gaussian vector or norm of a std the
    optimizer's plan sets, and the exponential mechanism's choice among scores. ``cost`` is the zCDP of a
    release, charged to the privacy filter before it exists; ``unnoised_mean`` is for scores computed and
    consumed inside the door, never released."""

    def cost(self, clip: float, std: float) -> float: ...

    def release_mean(self, sums: Sequence[torch.Tensor], std: float) -> Tensors: ...

    def release_norm(self, sums: Sequence[torch.Tensor], std: float) -> float: ...

    def release_choice(self, scores: Sequence[float], scale: float) -> int: ...

    def unnoised_mean(self, sums: Sequence[torch.Tensor]) -> Tensors: ...


@runtime_checkable
class Periodic(Protocol):
    """A mechanism that holds private state within a period of ``period`` steps (a tree's un-noised sum and
    live node noise, a scheduled Gaussian's running release): a checkpoint may be taken only
    ``at_boundary``, and a run rewound there ``reset``s it."""

    period: int
    at_boundary: bool

    def reset(self) -> None: ...


# ------------------------------------------------------------------ trackers
@runtime_checkable
class Tracker(Protocol):
    """Counts the private steps executed; the run's DpEvent is their exact composition (docs/design.md,
    "Privacy invariants"). ``record_step`` is called before a step's first release exists, so a crash never
    leaves a release unaccounted. ``align`` rounds ``steps`` up to what a rewound run must keep charged
    (a tree's period cut short is burned whole; nothing for the others)."""

    steps: int
    delta: Optional[float]

    def record_step(self) -> None: ...

    def event(self) -> Any: ...  # a dp_accounting.DpEvent

    def epsilon(self) -> float: ...

    def rho(self) -> Optional[float]: ...

    def align(self) -> None: ...


@runtime_checkable
class CountsStarts(Protocol):
    """A tracker of two release classes (Kornowski et al.'s multi-pass runs): ``starts`` counts the restarts among
    its steps, one every ``period`` steps; both are saved with a checkpoint and its intent."""

    starts: int
    period: int


@runtime_checkable
class PrivacyFilter(Protocol):
    """A tracker charged each release's exact zCDP cost before the release exists, refusing any past its
    budget (the KL paper's runs). ``spent`` is the realised spend (public: a function of the plan and of
    released values), saved with a checkpoint; ``step_cost_bound`` bounds one step's, for the intent."""

    spent: float
    step_cost_bound: float

    def charge(self, cost: float) -> None: ...

    def open(self) -> bool: ...

    def affords(self, cost: float) -> bool: ...


# ------------------------------------------------------------------ samplers
@runtime_checkable
class Sampler(Protocol):
    """Picks each step's private rows; its ``wrap`` is the amplification the accountant is told about, so the
    sampler that draws the batches is the one accounted for (docs/design.md, "Privacy invariants")."""

    kind: str
    expected_batch_size: int  # public: what a step's sums are normalised by
    rate: float
    rows: int  # the public row count the accounting and the report use
    event_phrase: str

    def wrap(self, event: Any) -> Any: ...  # a dp_accounting.DpEvent in, the sampled one out

    def describe(self) -> str: ...

    def use_generator(self, generator: Any) -> None: ...


@runtime_checkable
class RandomBatches(Protocol):
    """A sampler whose batches are drawn afresh each step from a private generator (Poisson, fixed size) or
    are the whole data (full batch)."""

    def sample(self) -> torch.Tensor: ...


@runtime_checkable
class ScheduledBatches(Protocol):
    """A sampler whose batches follow a public schedule (a single pass): step ``step``'s batch size is
    ``batch_at(step)``, and its rows depend on how many private steps were ever executed, so a rewound or
    resumed run reads fresh rows for every step it runs again."""

    def batch_at(self, step: int) -> int: ...

    def sample_at(self, step: int, spent: int) -> torch.Tensor: ...


# ------------------------------------------------------------------ optimizers
@runtime_checkable
class Optimizer(Protocol):
    """Applies released updates to the parameters in place. Everything it reads was released, so its state
    is post-processing and is checkpointed with the trajectory."""

    def apply(self, update: Any) -> None: ...  # an Update

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@runtime_checkable
class SelfStopping(Protocol):
    """An optimizer that says when the run is over (the KL paper's: its phases done, or the privacy filter
    unable to pay for the next release); the loop stops before the step it would refuse."""

    def done(self, tracker: Any) -> bool: ...


@runtime_checkable
class RequestsReleases(Protocol):
    """An optimizer that plans its own releases (the KL paper's): ``request`` is the next one, a public function
    of its state and of the privacy filter's spend (None when it has nothing left to ask)."""

    def request(self, tracker: Any) -> Any: ...


@runtime_checkable
class RemembersPreviousPoint(Protocol):
    """An optimizer whose oracle differences across consecutive query points (O2NC with a SPIDER oracle)."""

    def offset_to_previous(self) -> Optional[Tensors]: ...


@runtime_checkable
class Finalizing(Protocol):
    """An optimizer whose output is not its last iterate (O2NC's window average, the proximal point's
    weighted average, adaptive noisy GD's w_T): ``finalize`` writes it into the parameters once the run ends."""

    def finalize(self) -> None: ...


@runtime_checkable
class Certifying(Protocol):
    """An optimizer that can certify its output on a problem known exactly (O2NC's Goldstein window
    certificate; None until a window completes)."""

    def certificate(self) -> Optional[float]: ...


# ------------------------------------------------------------------ backends
@runtime_checkable
class Backend(Protocol):
    """Where the model replicas and the private rows live (in process, or on Ray actors). ``query`` returns
    only per-example clipped sums, never a per-example value; the caller adds the noise. ``sync`` pushes
    the driver's parameters to remote replicas (after a warm start or a checkpoint load; nothing to do in
    process) and ``close`` gives back what the backend holds."""

    directions: Any  # Directions over the trainable parameters
    optimizer: Optimizer

    @property
    def n_private(self) -> int: ...

    def step_scope(self, seeds: Sequence[int], ahead: Sequence[int] = ()) -> ContextManager[None]: ...

    def query(self, query: Any, indices: torch.Tensor, clip: float) -> Any: ...

    def apply(self, update: Any) -> None: ...

    def sync(self) -> None: ...

    def close(self) -> None: ...
