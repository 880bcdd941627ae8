"""One private step as data flows (docs/design.md, "One private step"), repeated.

    sampler -> indices -> backend.query (per-example clip, sums) -> accountant records the step's event
    -> mechanism.release* (the only private output) -> estimator combines -> backend.apply

What the loop asks of each part is stated in components/protocols.py; what only some parts can do (a
mechanism's period, a sampler's schedule, an optimizer that stops itself, a tracker's extra counts) is
asked with ``isinstance`` against a capability protocol there.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Tuple, cast

import torch

from components.queries import (
    DENSE_QUERIES,
    EmbeddedGradients,
    PerExampleGradients,
    PerExampleSphere,
    VectorFiniteDifferences,
)
from components.protocols import (
    Backend,
    CountsStarts,
    Estimator,
    FullBatchReleases,
    Mechanism,
    Periodic,
    PrivacyFilter,
    QueryReleases,
    RemembersPreviousPoint,
    RequestsReleases,
    RunningSumReleases,
    Sampler,
    ScheduledBatches,
    SelfStopping,
    Tracker,
)


class PrivacyBudgetError(RuntimeError):
    """An estimator asked for more noisy releases in a step than it declared (and was calibrated for)."""


class NonFiniteError(ValueError):
    """A release or the parameters became NaN or inf: the run stops rather than train on NaN. Both checks
    read only released values and what was computed from them (post-processing), never a per-example
    value; a ValueError, so the command line reports it in one line."""


def _all_finite(tensors) -> bool:
    # a sum in the tensors' own dtype is NaN or inf whenever a value is, at memory speed with one host sync
    # (float64 sums or isfinite masks cost 10-40x more on a 22M-parameter model); only a sum that overflows
    # on finite values is confirmed element by element
    tensors = [torch.as_tensor(t).detach() for t in tensors]
    if bool(torch.isfinite(torch.as_tensor(sum(t.sum() for t in tensors)))):
        return True
    return all(bool(torch.isfinite(t).all()) for t in tensors)


@dataclass(frozen=True)
class JournalEntry:
    """x_{t+1} = x_t - lr * sum coefficient * u(seed): seeded updates replay from these."""

    step: int
    seed: int
    coefficient: float


class StepContext:
    """What an estimator sees during one step: public facts, and the doors (``release`` and its kin) through
    which alone private data reaches it, each a noisy release counted against the estimator's declared
    ``queries_per_step`` and recorded by the tracker before it exists (docs/design.md, "One private step")."""

    def __init__(self, loop: "PrivateLoop", indices: torch.Tensor, batch_normaliser: float):
        self.step: int = loop.step
        self.seed: int = loop.seed
        self.public: Any = loop.public  # the public rows' oracle (components/estimators/public.py), or None
        self.batch_normaliser = float(batch_normaliser)  # the public batch size a step's sums are divided by
        self._loop = loop
        self._indices: torch.Tensor = indices
        self.used = 0
        self._step_recorded = False
        self.released: List[float] = []

    def _admit(self, releases: int) -> None:
        """The one admission every door passes (privacy invariant 1): ``releases`` more noisy releases this
        step must fit the ``queries_per_step`` the estimator declared and was calibrated for."""
        loop = self._loop
        if self.used + releases > loop.estimator.queries_per_step:
            raise PrivacyBudgetError(f"{loop.estimator.name}: {self.used + releases} noisy queries in step "
                                     f"{self.step}, declared {loop.estimator.queries_per_step}")
        self.used += releases

    def _private_sums(self, query, clip: float):
        """The clipped per-row (per-person) sums of ``query`` over the step's batch, after ``_admit``; the step
        is recorded with the tracker once they exist and before any release made from them does, so a crash
        never leaves a release unaccounted."""
        sums = self._loop.backend.query(query, self._indices, clip)
        if not self._step_recorded:
            self._loop.tracker.record_step()
            self._step_recorded = True
        return sums

    def release(self, query):
        """The step's clipped sums for ``query``, released by the mechanism with the noise it was calibrated
        for: scalars for finite differences and loss values, tensors for d-dimensional queries."""
        loop = self._loop
        mechanism = cast(QueryReleases, loop.mechanism)
        if isinstance(query, PerExampleSphere):
            self._check_bound(query, mechanism.clip)
        self._admit(1 if isinstance(query, DENSE_QUERIES) else query.size)
        sums = self._private_sums(query, mechanism.clip)
        if isinstance(query, (PerExampleGradients, PerExampleSphere)):
            return self._finite(mechanism.release_vector(list(sums)))
        if isinstance(query, EmbeddedGradients):
            embedding, residual = sums
            return self._finite(mechanism.release_embedded(embedding, list(residual), query.residual_clip,
                                                           query.embedding_share))
        if isinstance(query, VectorFiniteDifferences):
            directions = loop.backend.directions
            # summed in float64: in float32 the rounding let one example move the sum past its clip (by ~1e-6 C)
            vector = [sum(float(w) * directions.tensor(d.seed, i).double() for w, d in zip(sums, query.directions))
                      for i in range(len(directions.params))]
            released = mechanism.release_vector(vector)
            return self._finite([r.to(p.dtype) for r, p in zip(released, directions.params)])
        noisy = self._finite(mechanism.release_scalars(sums))
        self.released.extend(float(v) for v in noisy)
        return noisy

    def _check_bound(self, query: PerExampleSphere, bound: float) -> None:
        """A sphere query's per-example bound may not exceed what its mechanism was calibrated for."""
        own = query.vector_bound(self._loop.backend.directions.dim)
        if own > bound * (1 + 1e-9):
            raise PrivacyBudgetError(f"{self._loop.estimator.name}: step {self.step} asks for per-example vectors up "
                                     f"to {own:.6g}, above the {bound:.6g} its mechanism is calibrated for")

    def release_increment(self, query: PerExampleSphere):
        """The tree door (O2NC with a variance-reduced oracle): the batch mean of the query's clipped per-example
        vectors is this step's increment; the tree-aggregation mechanism keeps the period's un-noised
        running sum and returns only that sum plus tree noise. One increment a step."""
        loop = self._loop
        mechanism = cast(RunningSumReleases, loop.mechanism)
        if mechanism.private:
            # one row moves a batch mean by at most its bound over the batch, twice that under replace-one
            self._check_bound(query, mechanism.sensitivity * self.batch_normaliser / mechanism.neighbour_factor)
        self._admit(1)
        sums = self._private_sums(query, mechanism.clip)
        released = mechanism.release_running_sum([t / self.batch_normaliser for t in sums])
        params = loop.backend.directions.params
        return self._finite([r.to(device=p.device, dtype=p.dtype) for r, p in zip(released, params)])

    def request(self):
        """The optimizer's next release (the KL paper's optimizers plan their own): a public function of its
        state and of the privacy filter's public spend."""
        return cast(RequestsReleases, self._loop.backend.optimizer).request(self._loop.tracker)

    def release_full_batch(self, request):
        """Menart et al. (KL)'s door: the mean over every private row of per-example vectors clipped at the request's
        clip, plus Gaussian noise of the request's std; with ``norm_std`` first a noisy norm of that mean,
        from which the request sets the vector's std (adaptive GD). Each release's exact cost is charged to
        the privacy filter before it exists. Returns (released norm or None, released vector)."""
        loop = self._loop
        mechanism, tracker = cast(FullBatchReleases, loop.mechanism), cast(PrivacyFilter, loop.tracker)
        self._admit(2 if request.norm_std is not None else 1)
        query = request.query()
        sums = self._private_sums(query, mechanism.clip)
        norm, std = None, request.std
        if request.norm_std is not None:
            tracker.charge(mechanism.cost(query.clip, request.norm_std))
            norm = mechanism.release_norm(sums, request.norm_std)
            std = request.std_for(norm)
        tracker.charge(mechanism.cost(query.clip, std))
        released = mechanism.release_mean(sums, std)
        del sums
        params = loop.backend.directions.params
        return norm, self._finite([r.to(device=p.device, dtype=p.dtype) for r, p in zip(released, params)])

    def release_selection(self, request) -> int:
        """Menart et al. (KL)'s Theorem 5: the index of one of ``request.offsets`` (iterates relative to the parameters)
        drawn by the exponential mechanism on the norm of the clipped mean gradient there; the scores stay here."""
        loop = self._loop
        mechanism, tracker = cast(FullBatchReleases, loop.mechanism), cast(PrivacyFilter, loop.tracker)
        self._admit(1)
        scores = []
        for offset in request.offsets:
            sums = self._private_sums(request.query(offset), mechanism.clip)
            scores.append(math.sqrt(sum(float(t.pow(2).sum()) for t in mechanism.unnoised_mean(sums))))
        tracker.charge(request.cost)
        index = mechanism.release_choice(scores, request.scale)
        del scores
        return index

    def offset_to_previous(self):
        """z_(t-1) - z_t: the previous query point relative to this one (O2NC's public geometry)."""
        offset = cast(RemembersPreviousPoint, self._loop.backend.optimizer).offset_to_previous()
        if offset is None:
            raise ValueError(f"{self._loop.estimator.name}: step {self.step} has no previous query point")
        return offset

    def _finite(self, released):
        """``released``, once checked finite. Clipped sums plus noise always are; without clipping
        (mechanism none) a NaN or inf loss passes through, and no estimator may turn it into an update."""
        parts = released if isinstance(released, (list, tuple)) else [released]
        flat = [t for part in parts for t in (part if isinstance(part, (list, tuple)) else [part])]
        if not _all_finite(flat):
            unclipped = " (mechanism none does not clip: a per-example loss or gradient was NaN or inf)" \
                if self._loop.mechanism.clip == float("inf") else ""
            raise NonFiniteError(f"training diverged: a value released at step {self.step} is not finite{unclipped}; "
                                 "lower optimizer.lr or estimator.smoothing, or check the model")
        return released


@dataclass
class PrivateLoop:
    """Runs private steps. Holds no private row itself: the backend holds them, and only the mechanism's
    releases leave the step (docs/design.md, "Privacy invariants")."""

    backend: Backend
    sampler: Sampler
    estimator: Estimator
    mechanism: Mechanism
    tracker: Tracker
    seed: int
    public: Any = None  # the public rows' oracle (components/estimators/public.py), or None
    step: int = 0
    journal: List[JournalEntry] = field(default_factory=list)
    released: List[Tuple[int, Tuple[float, ...]]] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        """An optimizer that stops on its own (the KL paper's: phases done, or the filter's budget spent) says so."""
        optimizer = self.backend.optimizer
        return isinstance(optimizer, SelfStopping) and bool(optimizer.done(self.tracker))

    def run(self, until: int, on_step: Optional[Callable[[int], None]] = None) -> None:
        # what the parts can do is asked once a run, not once a step: a protocol isinstance costs ~10 us,
        # a few percent of a small model's whole step, and the parts do not change mid-run
        optimizer = self.backend.optimizer
        stops = isinstance(optimizer, SelfStopping)
        scheduled = isinstance(self.sampler, ScheduledBatches)
        while self.step < until and not (stops and optimizer.done(self.tracker)):
            if scheduled:
                # a single pass reads fresh rows for every step ever executed (discarded ones included), in
                # batches of the sizes its public schedule sets
                indices = self.sampler.sample_at(self.step, self.tracker.steps)
                batch = self.sampler.batch_at(self.step)
            else:
                indices, batch = self.sampler.sample(), self.sampler.expected_batch_size
            ctx = StepContext(self, indices, batch)
            seeds = self.estimator.direction_seeds(self.step, self.seed)
            ahead = self.estimator.direction_seeds(self.step + 1, self.seed)  # public: may be drawn early
            with self.backend.step_scope(seeds, ahead):
                update = self.estimator.step(ctx)
                del indices, ctx._indices
                if ctx.used == 0:
                    raise PrivacyBudgetError(f"{self.estimator.name}: step {self.step} made no private query")
                try:
                    self.backend.apply(update)
                except RuntimeError as err:  # torch refuses a step size its parameters' type cannot hold
                    if "overflow" not in str(err):
                        raise
                    raise NonFiniteError(f"training diverged: step {self.step}'s update overflows the parameters' "
                                         "type; lower optimizer.lr") from None
            if not _all_finite(self.backend.directions.params):
                raise NonFiniteError(f"training diverged: the model's parameters are not finite after step "
                                     f"{self.step}'s update; lower optimizer.lr (or the clip), or check the model")
            self.journal.extend(JournalEntry(self.step, s, c) for s, c in update.terms)
            if ctx.released:
                self.released.append((self.step, tuple(ctx.released)))
            self.step += 1
            if on_step is not None:
                on_step(self.step)

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """The trajectory at ``step``: trainable parameters, optimizer state, journal and released values,
        plus the privacy steps spent so far. Plain tensors, numbers and tuples (loads with weights_only).
        Holds no private row, no un-noised sum and no private generator state."""
        return {
            "step": self.step,
            "params": [p.detach().cpu().clone() for p in self.backend.directions.params],
            "optimizer": self.backend.optimizer.state_dict(),
            "journal": [(e.step, e.seed, e.coefficient) for e in self.journal],
            "released": [(step, tuple(values)) for step, values in self.released],
            "privacy_steps": self.tracker.steps,
            # a tracker of two release classes (ScheduledTracker) also counts the restarts among them
            **({"privacy_starts": self.tracker.starts} if isinstance(self.tracker, CountsStarts) else {}),
            # a privacy filter's realised spend (public: a function of the plan and of released values)
            **({"privacy_spent": self.tracker.spent} if isinstance(self.tracker, PrivacyFilter) else {}),
        }

    @torch.no_grad()
    def load_state_dict(self, state: dict, *, restore_privacy_steps: bool) -> None:
        """Return to a saved trajectory. ``restore_privacy_steps=False`` keeps this process's count of
        steps spent, so steps executed after the checkpoint and now discarded stay charged (an in-process
        retry); a new process resuming a killed run restores the count saved with the checkpoint."""
        params = self.backend.directions.params
        if len(state["params"]) != len(params) or any(
                saved.shape != p.shape for saved, p in zip(state["params"], params)):
            raise ValueError("checkpoint: its parameters do not fit this spec's model")
        for p, saved in zip(params, state["params"]):
            p.copy_(saved)
        self.backend.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        self.journal = [JournalEntry(int(s), int(seed), float(c)) for s, seed, c in state["journal"]]
        self.released = [(int(step), tuple(values)) for step, values in state["released"]]
        if restore_privacy_steps:
            self.tracker.steps = int(state["privacy_steps"])
            if isinstance(self.tracker, CountsStarts):
                self.tracker.starts = int(state["privacy_starts"])
            if isinstance(self.tracker, PrivacyFilter):
                self.tracker.spent = float(state["privacy_spent"])
        # a tree run goes back to a period boundary: a fresh tree, and the aborted period's rows stay used
        if isinstance(self.mechanism, Periodic):
            self.mechanism.reset()
        self.tracker.align()
        self.backend.sync()  # remote replicas continue from the restored parameters
