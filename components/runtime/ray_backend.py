"""Ray backend: forward passes on actors, synchronised by seeds and scalars.

Each worker actor builds its own model replica (public init from the seed) and loads the private rows
itself from the spec's data source; the driver sends only row indices, queries (seeds, or dense
public directions) and updates, and receives only clipped per-example sums. The driver adds the noise
once. The driver also keeps a replica (for public gradients and evaluation) and is the source of truth:
a worker whose checksum disagrees, or that died, is rebuilt from the driver's parameters, and the
query in flight is asked again - no release has happened for it yet, so nothing is released twice.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from typing import Any, Dict, List, Optional

import numpy as np
import ray
import torch

from components.estimators.queries import (
    DENSE_QUERIES,
    EmbeddedGradients,
    FiniteDifferences,
    LossValues,
    PerExampleGradients,
    PerExampleSphere,
    Query,
    Seeded,
    Update,
    VectorFiniteDifferences,
)


class DataChanged(RuntimeError):
    """A worker's private rows differ from the driver's."""


@ray.remote
class ReplicaWorker:
    """One model replica plus the private rows it loaded itself (never sent by the driver)."""

    def __init__(self, spec: Dict[str, Any]):
        from components import builders  # imported here: builders itself imports this module
        from specs import RunSpec

        run_spec = RunSpec.model_validate(spec)
        data = builders.load_data(run_spec)
        self.rows_digest = data.ordered_digest
        self.built = builders.build_local(run_spec, data)
        self.backend = self.built.backend
        self._scope: Optional[contextlib.ExitStack] = None
        self._seeds: tuple = ()

    def _enter(self, seeds) -> None:
        seeds = tuple(seeds)
        if seeds == self._seeds and self._scope is not None:
            return
        self._leave()
        self._scope = contextlib.ExitStack()
        self._scope.enter_context(self.backend.step_scope(seeds))
        self._seeds = seeds

    def _leave(self) -> None:
        if self._scope is not None:
            self._scope.close()
        self._scope, self._seeds = None, ()

    def query(self, message, indices: np.ndarray, clip: float, seeds=None):
        query = decode_query(message)
        # cache mode: the step's directions are drawn once, for its queries and its update
        self._enter(seeds if seeds is not None else seeds_of(query))
        sums = self.backend.query(query, torch.as_tensor(indices, dtype=torch.long), clip)
        if isinstance(query, (PerExampleGradients, PerExampleSphere)):
            return [t.cpu() for t in sums]  # one clipped sum per parameter tensor
        if isinstance(query, EmbeddedGradients):
            embedding, residual = sums
            return embedding.cpu(), [t.cpu() for t in residual]
        return sums.tolist()

    def apply(self, message, ahead=()) -> float:
        update = decode_update(message)
        self._enter(tuple(seed for seed, _ in update.terms) or self._seeds)
        self.backend.apply(update)
        self._leave()
        if ahead and self.backend.prefetch_directions:
            # drawn while the driver releases and combines the next step's queries
            self.backend.directions.prefetch(ahead)
        return self.checksum()

    def private_rows_digest(self) -> str:
        return self.rows_digest

    def checksum(self) -> float:
        return parameter_checksum(self.backend.directions.params)

    def load_parameters(self, tensors: List[torch.Tensor], optimizer_state: dict) -> float:
        with torch.no_grad():
            for p, t in zip(self.backend.directions.params, tensors):
                p.copy_(t)
        self.backend.optimizer.load_state_dict(optimizer_state)
        return self.checksum()

    def pid(self) -> int:
        import os

        return os.getpid()


# ---------------------------------------------------------------- wire format
# Seeded queries and updates travel as plain tuples of ints and floats (a few bytes each), not as
# pickled classes or tensors; dense directions (public gradients, PAZO-P/S) travel as tensors.
def encode_query(query: Query):
    if isinstance(query, (FiniteDifferences, VectorFiniteDifferences)) and all(
            isinstance(d, Seeded) for d in query.directions):
        tag = "fd" if isinstance(query, FiniteDifferences) else "vfd"
        return (tag, tuple(d.seed for d in query.directions), query.smoothing)
    return query


def decode_query(message) -> Query:
    if isinstance(message, tuple):
        tag, seeds, smoothing = message
        cls = FiniteDifferences if tag == "fd" else VectorFiniteDifferences
        return cls(tuple(Seeded(s) for s in seeds), smoothing)
    return message


def seeds_of(query: Query) -> tuple:
    if isinstance(query, PerExampleSphere):
        return ()  # per-example directions, drawn with the rows
    return tuple(d.seed for d in getattr(query, "directions", ()) if isinstance(d, Seeded))


def encode_update(update: Update):
    return update.terms if not update.dense else update


def decode_update(message) -> Update:
    return message if isinstance(message, Update) else Update(terms=tuple(message))


def parameter_checksum(params) -> float:
    """Order-sensitive float64 checksum of the parameters (equal replicas give equal checksums)."""
    total = 0.0
    for i, p in enumerate(params):
        flat = p.detach().double().flatten()
        weights = torch.linspace(1.0, 2.0, flat.numel(), dtype=torch.float64, device=flat.device)
        total += (i + 1) * float((flat * weights).sum())
    return total


class RayBackend:
    """Same protocol as LocalBackend (``query``, ``apply``, ``step_scope``, ``directions``)."""

    def __init__(self, local, spec: Dict[str, Any], *, n_private: int, private_digest: str, workers: int,
                 gpus_per_worker: float, address: str, parallelism: str, checksum_every: int):
        if not ray.is_initialized():
            if address == "local":
                # Ray's default for a new local cluster (token authentication) stays; only its notice that
                # it chose it, printed on every run, is not shown
                logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
                ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
            else:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
        self.local = local  # the driver's replica: source of truth, public gradients, evaluation
        self._n_private = n_private  # the driver holds no private rows in this mode, only their count
        self._private_digest = private_digest  # ... and their ordered digest, which every worker must match
        self.directions = local.directions
        self.optimizer = local.optimizer
        self.model = local.model
        self._spec = spec
        self._gpus = gpus_per_worker
        self.parallelism = parallelism
        self.checksum_every = checksum_every
        self.workers = [self._start() for _ in range(workers)]
        self._seeds: tuple = ()
        self._ahead: tuple = ()
        self.applied = 0
        self.restarts = 0
        self.resyncs = 0

    def _start(self):
        worker = ReplicaWorker.options(num_gpus=self._gpus, num_cpus=0).remote(self._spec)
        if ray.get(worker.private_rows_digest.remote()) != self._private_digest:
            # indices sent to this worker would name other rows than the ones sampled and accounted
            ray.kill(worker)
            raise DataChanged("data.source: a Ray worker loaded different private or public rows than the driver "
                              "(the data changed after the run started); run again once the data stops changing")
        ray.get(worker.load_parameters.remote([p.detach().cpu() for p in self.directions.params],
                                              self.optimizer.state_dict()))
        return worker

    @property
    def n_private(self) -> int:
        return self._n_private

    @contextlib.contextmanager
    def step_scope(self, seeds, ahead=()):
        self._seeds = tuple(seeds)
        self._ahead = tuple(ahead) if self.local.prefetch_directions else ()
        with self.local.step_scope(seeds, ahead):
            yield

    # ---------------------------------------------------------------- queries
    def _split(self, query: Query, indices: np.ndarray):
        """(worker, query part, index part) per worker; how results combine back."""
        n = len(self.workers)
        if self.parallelism == "directions" and not isinstance(query, DENSE_QUERIES) and query.size > 1:
            parts = np.array_split(np.arange(query.size), min(n, query.size))
            jobs = []
            for w, part in enumerate(parts):
                if isinstance(query, FiniteDifferences):
                    sub = FiniteDifferences(tuple(query.directions[i] for i in part), query.smoothing)
                else:
                    sub = LossValues(tuple(query.points[i] for i in part))
                jobs.append((w, sub, indices))
            return jobs, "concat"
        chunks = np.array_split(indices, n)
        if isinstance(query, PerExampleSphere):
            # each row keeps the directions of its place in the whole batch, whichever worker holds it
            starts = np.cumsum([0] + [len(c) for c in chunks[:-1]])
            return [(w, dataclasses.replace(query, first_slot=query.first_slot + int(start)), chunk)
                    for w, (start, chunk) in enumerate(zip(starts, chunks))], "sum"
        return [(w, query, chunk) for w, chunk in enumerate(chunks)], "sum"

    def query(self, query: Query, indices: torch.Tensor, clip: float) -> torch.Tensor:
        idx = indices.cpu().numpy().astype(np.int32 if self._n_private < 2**31 else np.int64)
        jobs, how = self._split(query, idx)
        for attempt in range(3):
            refs = [self.workers[w].query.remote(*self.message(q, part, clip)) for w, q, part in jobs]
            try:
                results = ray.get(refs)
                break
            except ray.exceptions.RayActorError:
                self._replace_dead()
        else:
            raise RuntimeError("ray backend: workers kept dying; no value was released for this step")
        params = self.local.directions.params
        if isinstance(query, (PerExampleGradients, PerExampleSphere)):
            return tuple(sum(parts).to(device=p.device) for parts, p in zip(zip(*results), params))
        if isinstance(query, EmbeddedGradients):
            embedding = sum(e for e, _ in results).to(device=query.basis.device)
            residual = tuple(sum(parts).to(device=p.device) for parts, p in zip(zip(*(r for _, r in results)), params))
            return embedding, residual
        parts = [torch.tensor(r, dtype=torch.float64) for r in results]
        if how == "concat":
            return torch.cat(parts)
        return torch.stack(parts).sum(dim=0)

    def message(self, query: Query, indices: np.ndarray, clip: float) -> tuple:
        """Arguments of one worker query; the cache seeds are sent only when the query does not imply them."""
        encoded = encode_query(query)
        implied = seeds_of(query) == self._seeds
        return (encoded, indices, clip) if implied else (encoded, indices, clip, self._seeds)

    # ---------------------------------------------------------------- updates
    def apply(self, update: Update) -> None:
        self.local.apply(update)
        message = encode_update(update)
        refs = [w.apply.remote(message, self._ahead) for w in self.workers]
        try:
            sums = ray.get(refs)
        except ray.exceptions.RayActorError:
            self._replace_dead()
            sums = ray.get([w.checksum.remote() for w in self.workers])
        self.applied += 1
        if self.applied % self.checksum_every == 0:
            self.verify(sums)

    def verify(self, sums: Optional[List[float]] = None) -> None:
        """Resynchronise any replica whose checksum differs from the driver's."""
        if sums is None:
            sums = ray.get([w.checksum.remote() for w in self.workers])
        reference = parameter_checksum(self.directions.params)
        tol = 1e-9 * max(1.0, abs(reference))
        for w, value in enumerate(sums):
            if not math.isclose(value, reference, rel_tol=0, abs_tol=tol):
                self._push(self.workers[w])
                self.resyncs += 1

    def sync(self) -> None:
        """Push the driver's parameters to every replica (after public warm start or a checkpoint load)."""
        for worker in self.workers:
            self._push(worker)

    def _push(self, worker) -> None:
        ray.get(worker.load_parameters.remote([p.detach().cpu() for p in self.directions.params],
                                              self.optimizer.state_dict()))

    def _replace_dead(self) -> None:
        for w, worker in enumerate(self.workers):
            try:
                ray.get(worker.pid.remote(), timeout=60)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                self.workers[w] = self._start()  # rebuilt from the driver's parameters
                self.restarts += 1

    def worker_pids(self) -> List[int]:
        return ray.get([w.pid.remote() for w in self.workers])

    def close(self) -> None:
        for w in self.workers:
            ray.kill(w)
        self.workers = []
