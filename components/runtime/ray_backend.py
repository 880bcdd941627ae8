"""Ray backend: forward passes on actors, synchronised by seeds and scalars.

Each worker actor builds its own model replica (public init from the seed) and loads the private rows
itself from the spec's data source; the driver sends only row indices, queries (seeds, or dense
public directions) and updates, and receives only clipped per-example sums. The driver adds the noise
once. The driver also keeps a replica (for public gradients and evaluation) and is the source of truth:
a worker whose checksum disagrees, or that died, is rebuilt from the driver's parameters, and the
query in flight is asked again - no release has happened for it yet, so nothing is released twice.
"""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import ray
import torch

from components.queries import (
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
from components.runtime.workers import DataChanged  # noqa: F401 - raised here, and where callers catch it


class DataUnreadable(RuntimeError):
    """A worker's node cannot read the spec's data source."""


class ModelChanged(RuntimeError):
    """A worker built other weights than the driver from the same spec (another model folder or package on
    its node): its forward passes would compute another function than the one the driver trains."""


def frozen_digests(model: torch.nn.Module, trainable) -> Dict[str, str]:
    """name -> digest of the bytes, dtype and shape of every parameter and buffer outside ``trainable``: what
    a replica builds from the spec alone and the driver never pushes (a pretrained model's frozen weights).
    The trainable ones are pushed by the driver when a worker starts, so they need not agree here."""
    import hashlib

    pushed = {id(p) for p in trainable}
    out: Dict[str, str] = {}
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if id(tensor) in pushed:
            continue
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        h = hashlib.sha256(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
        h.update(flat.view(torch.uint8).numpy().tobytes())
        out[name] = h.hexdigest()[:32]
    return out


class PlacementError(RuntimeError):
    """The cluster cannot place the workers the spec asks for."""


class ClusterLost(RuntimeError):
    """The driver lost its connection to the Ray cluster (its head) mid-run."""


class ClusterUnreachable(ValueError):
    """``execution.address`` names a cluster this driver cannot reach (before anything is reserved)."""


# how long a feasible placement may wait for room (a busy cluster, a node that is coming back)
PLACEMENT_TIMEOUT_S = 600.0
START_ATTEMPTS = 5


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


@ray.remote
class ReplicaWorker:
    """One model replica plus the private rows it loaded itself (never sent by the driver).

    ``assemble(spec) -> (ordered digest of the rows, local backend)`` is the one place a replica is built
    (components.builders.build_replica); it is handed in, so this runtime stands below the builders."""

    def __init__(self, assemble, spec: Dict[str, Any]):
        self.node = ray.util.get_node_ip_address()
        self.error: Optional[str] = None
        self.weights: Dict[str, str] = {}
        try:
            self.rows_digest, self.backend = assemble(spec)
            self.weights = frozen_digests(self.backend.model, self.backend.directions.params)
        except Exception as err:  # told to the driver, in one line, by identify()
            self.rows_digest, self.backend, self.error = None, None, first_line(err)
        self._scope: Optional[contextlib.ExitStack] = None
        self._seeds: tuple = ()

    def identify(self) -> tuple:
        """(node address, ordered digest of the rows this replica loaded, why it could not load them, the
        digests of the weights it built and the driver does not push)."""
        return self.node, self.rows_digest, self.error, self.weights

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
    """The seeded directions a query implies. A sphere query's are per example, drawn with the rows; loss
    values at dense points and per-example gradients have none."""
    if isinstance(query, (FiniteDifferences, VectorFiniteDifferences)):
        return tuple(d.seed for d in query.directions if isinstance(d, Seeded))
    return ()


def encode_update(update: Update):
    return update.terms if not update.dense else update


def decode_update(message) -> Update:
    return message if isinstance(message, Update) else Update(terms=tuple(message))


# Ray puts the driver's working directory first on its workers' sys.path: run from a folder holding one named
# like a package of privzo's (a user's own specs/ or flows/), the workers would import that one. Ray is started
# from privzo's own root instead, which its workers then find first (and start in).
PRIVZO_ROOT = Path(__file__).resolve().parents[2]


def _init(**options) -> None:
    with contextlib.chdir(PRIVZO_ROOT):
        ray.init(**options)


def _join(address: str, attempts: int = 3) -> None:
    """Connect to a running cluster. A Ray Client session the head fails to set up (ConnectionAbortedError,
    seen on a busy head) is asked for again; a cluster that cannot be reached is refused in one line."""
    for attempt in range(attempts):
        try:
            _init(address=address, log_to_driver=False, configure_logging=False)
            return
        except (ConnectionError, RuntimeError) as err:
            if not isinstance(err, ConnectionAbortedError) or attempt == attempts - 1:
                raise ClusterUnreachable(f"execution.address: cannot reach the Ray cluster at {address} "
                                         f"({first_line(err)})") from None
            time.sleep(2.0)


def connect(address: str, cpus: float) -> None:
    """This process's Ray, once: a new local cluster (``address`` local) with at least ``cpus`` logical CPUs,
    else the running cluster at ``address``."""
    if ray.is_initialized():
        return
    if address == "local":
        # Ray's default for a new local cluster (token authentication) stays; only its notice that it chose
        # it, printed on every run, is not shown. Logical CPUs: enough for every bundle.
        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
        # Ray runs its workers at nice 15 so that a driver comes first; here the driver waits on them, and
        # at 15 any other busy process on the machine starves the run's steps (two actors took 68 s to
        # start beside 3 busy processes, 13 s at nice 0). A local cluster's raylet reads it from this
        # process's environment; one already set (the operator's) stays
        os.environ.setdefault("RAY_worker_niceness", "0")
        _init(include_dashboard=False, log_to_driver=False, configure_logging=False,
              num_cpus=max(os.cpu_count() or 1, math.ceil(cpus)), _temp_dir=_private_session_folder())
    else:
        _join(address)


def _private_session_folder() -> str:
    """Where a local Ray started here keeps its session (sockets, logs: one task marker per task run): a folder
    only this OS user reads (Ray's default, /tmp/ray, is world-readable and kept), removed when the process
    ends, so what the run's tasks were (a search's shares) is not left on disk."""
    folder = tempfile.mkdtemp(prefix="privzo-ray-")  # mode 0700; Ray opens its own folder to all (0777) inside

    def remove() -> None:
        if ray.is_initialized():
            ray.shutdown()
        shutil.rmtree(folder, ignore_errors=True)

    atexit.register(remove)  # Ray's own exit handler, registered later, runs first; this then removes the folder
    return os.path.join(folder, "ray")


def _resources(bundle: Dict[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in bundle.items())


def parameter_checksum(params) -> float:
    """Order-sensitive float64 checksum of the parameters (equal replicas give equal checksums)."""
    total = 0.0
    for i, p in enumerate(params):
        flat = p.detach().double().flatten()
        weights = torch.linspace(1.0, 2.0, flat.numel(), dtype=torch.float64, device=flat.device)
        total += (i + 1) * float((flat * weights).sum())
    return total


class RayBackend:
    """A components.protocols.Backend, as LocalBackend is: its ``sync`` pushes the driver's parameters to
    every worker, its ``close`` gives back the workers and their placement group.

    Workers are placed by a placement group: one bundle a worker spread across the nodes (SPREAD), or with
    ``workers_per_node`` one bundle a node holding that many workers, each bundle on its own node
    (STRICT_SPREAD). A worker lost with its node is started again in its bundle, which Ray moves to a
    node that has room."""

    def __init__(self, local, spec: Dict[str, Any], assemble, *, n_private: int, private_digest: str,
                 workers: int, gpus_per_worker: float, address: str, parallelism: str, checksum_every: int,
                 cpus_per_worker: float = 1.0, workers_per_node: Optional[int] = None,
                 persons: Optional[np.ndarray] = None):
        connect(address, workers * cpus_per_worker)
        self.workers: list = []
        self._group = None  # the placement group, once reserved (close gives it back)
        self.local = local  # the driver's replica: source of truth, public gradients, evaluation
        self._n_private = n_private  # the driver holds no private rows in this mode, only their count
        self._private_digest = private_digest  # ... and their ordered digest, which every worker must match
        # a person-level run: each private row's person, so that all of a person's rows go to one worker,
        # which clips their sum (the digest above covers the rows, the spec the persons' column)
        self._persons = None if persons is None else np.asarray(persons)
        self.directions = local.directions
        self.optimizer = local.optimizer
        self.model = local.model
        self._spec = spec
        self._assemble = assemble
        self._weights: Optional[Dict[str, str]] = None  # the driver's frozen weights, digested once
        self._address = address
        self._gpus = gpus_per_worker
        self._cpus = cpus_per_worker
        self._per_bundle = workers_per_node or 1
        self.parallelism = parallelism
        self.checksum_every = checksum_every
        self._group = self._place(workers, strict=workers_per_node is not None)
        try:
            self.workers = self._start_all(range(workers))
        except BaseException:
            self.close()
            raise
        self._seeds: tuple = ()
        self._ahead: tuple = ()
        self.applied = 0
        self.restarts = 0
        self.resyncs = 0

    # ---------------------------------------------------------------- placement
    def _bundle(self) -> Dict[str, float]:
        bundle = {"CPU": self._cpus * self._per_bundle}
        if self._gpus:
            bundle["GPU"] = self._gpus * self._per_bundle
        return bundle

    def _place(self, workers: int, strict: bool):
        from ray.util.placement_group import placement_group, remove_placement_group

        bundle, count = self._bundle(), workers // self._per_bundle
        strategy = "STRICT_SPREAD" if strict else "SPREAD"
        nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]
        room = [min(int(res.get(k, 0.0) / v + 1e-9) for k, v in bundle.items()) for res in nodes]
        fits = sum(1 for r in room if r) if strict else sum(room)
        if fits < count:
            per = f"{self._per_bundle} a node on {count} nodes" if strict else "spread across nodes"
            raise PlacementError(
                f"execution: the Ray cluster at {self._address} cannot place {workers} workers ({per}, "
                f"{_resources(bundle)} a bundle): its {len(nodes)} alive nodes have room for {fits} bundles; "
                "add nodes, or lower execution.workers, workers_per_node, cpus_per_worker or gpus_per_worker")
        group = placement_group([dict(bundle) for _ in range(count)], strategy=strategy)
        try:
            ray.get(group.ready(), timeout=PLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(group)
            raise PlacementError(f"execution: the Ray cluster at {self._address} has had no room for {count} "
                                 f"bundles of {_resources(bundle)} ({strategy}) for {PLACEMENT_TIMEOUT_S:.0f} s; "
                                 "other jobs hold its resources") from None
        return group

    def _launch(self, slot: int):
        """A new actor in ``slot``'s bundle and its pending identity (the replica is built on the way)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(self._group, placement_group_bundle_index=slot // self._per_bundle)
        worker = ReplicaWorker.options(num_cpus=self._cpus, num_gpus=self._gpus,
                                       scheduling_strategy=strategy).remote(self._assemble, self._spec)
        return worker, worker.identify.remote()

    def _start(self, slot: int):
        return self._start_all([slot])[0]

    def _start_all(self, slots) -> list:
        """Workers for ``slots``, all launched before any is waited on: each builds its replica (a process
        importing torch and reading the rows) at the same time as the others, not after them."""
        slots = list(slots)
        pending = {slot: self._launch(slot) for slot in slots}
        started = []
        try:
            for slot in slots:
                started.append(self._admit(slot, *pending.pop(slot)))
        except BaseException:
            for worker in started + [w for w, _ in pending.values()]:
                with contextlib.suppress(Exception):
                    ray.kill(worker)
            raise
        return started

    def _admit(self, slot: int, worker, identity):
        """``slot``'s worker once it has shown the driver's rows and frozen weights, holding its parameters."""
        for attempt in range(START_ATTEMPTS):
            try:
                node, digest, error, weights = ray.get(identity, timeout=PLACEMENT_TIMEOUT_S)
                break
            except ray.exceptions.GetTimeoutError:
                ray.kill(worker)
                raise PlacementError(f"execution: worker {slot} was not started within {PLACEMENT_TIMEOUT_S:.0f} s "
                                     "(its placement bundle has no node with room)") from None
            except ray.exceptions.RayActorError:
                # sent to a node that died before the cluster knew it: its bundle moves, and this start with it
                if attempt + 1 < START_ATTEMPTS:
                    worker, identity = self._launch(slot)
        else:
            raise RuntimeError(f"ray backend: worker {slot} died {START_ATTEMPTS} times while starting")
        if error is not None:
            ray.kill(worker)
            raise DataUnreadable(f"data.source: the Ray worker on node {node} cannot read the private rows "
                                 f"({error}); every node must read the spec's data source: a path on storage "
                                 "every node mounts, or a package installed on every node")
        if digest != self._private_digest:
            # indices sent to this worker would name other rows than the ones sampled and accounted
            ray.kill(worker)
            raise DataChanged(f"data.source: a Ray worker loaded different private or public rows than the driver "
                              f"(on node {node}: the data changed after the run started, or that node holds "
                              "another copy); every node must read the same rows")
        if self._weights is None:
            self._weights = frozen_digests(self.model, self.directions.params)
        differ = [name for name, value in self._weights.items() if weights.get(name) != value]
        differ += [name for name in weights if name not in self._weights]
        if differ:
            ray.kill(worker)
            raise ModelChanged(f"model: the Ray worker on node {node} built other weights than the driver from the "
                               f"same spec ({len(differ)} tensors differ, first {differ[0]}); every node must read the "
                               "same model folder or the same version of its package")
        ray.get(worker.load_parameters.remote([p.detach().cpu() for p in self.directions.params],
                                              self.optimizer.state_dict()))
        return worker

    def worker_nodes(self) -> List[str]:
        """The node address of each worker, in worker order."""
        return [info[0] for info in ray.get([w.identify.remote() for w in self.workers])]

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
        if self._persons is not None:
            owner = self._persons[indices] % n
            return [(w, query, indices[owner == w]) for w in range(n)], "sum"
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
        # asked again of a replaced worker: no value has been released for this step yet
        results = self._ask(lambda: [self.workers[w].query.remote(*self.message(q, part, clip)) for w, q, part in jobs])
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
        with self._cluster_kept():
            try:
                sums = ray.get([w.apply.remote(message, self._ahead) for w in self.workers])
            except ray.exceptions.RayActorError:
                # a replacement starts from the driver's parameters, this update included: not applied again
                self._replace_dead()
                sums = self._ask(lambda: [w.checksum.remote() for w in self.workers])
        self.applied += 1
        if self.applied % self.checksum_every == 0:
            self.verify(sums)

    def verify(self, sums: Optional[List[float]] = None) -> None:
        """Resynchronise any replica whose checksum differs from the driver's."""
        if sums is None:
            sums = self._ask(lambda: [w.checksum.remote() for w in self.workers])
        reference = parameter_checksum(self.directions.params)
        tol = 1e-9 * max(1.0, abs(reference))
        for w, value in enumerate(sums):
            if not math.isclose(value, reference, rel_tol=0, abs_tol=tol):
                self._push(self.workers[w])
                self.resyncs += 1

    def sync(self) -> None:
        """Push the driver's parameters to every replica (after public warm start or a checkpoint load)."""
        self._ask(lambda: [self._push_ref(w) for w in self.workers])

    def _push(self, worker) -> None:
        ray.get(self._push_ref(worker))

    def _push_ref(self, worker):
        return worker.load_parameters.remote([p.detach().cpu() for p in self.directions.params],
                                             self.optimizer.state_dict())

    def _ask(self, refs) -> list:
        """``ray.get(refs())``; a worker that died (alone or with its node) is replaced, and all are asked again."""
        with self._cluster_kept():
            for attempt in range(START_ATTEMPTS):
                try:
                    return ray.get(refs())
                except ray.exceptions.RayActorError:
                    self._replace_dead()
        raise RuntimeError("ray backend: workers kept dying; no value was released for this step")

    @contextlib.contextmanager
    def _cluster_kept(self):
        """A lost connection to the cluster's head (Ray Client gives up after its reconnection grace period)
        ends the run in one line: nothing was released for the step in flight, so a resume repeats it."""
        try:
            yield
        except ConnectionError as err:
            raise ClusterLost(f"execution.address: lost the Ray cluster at {self._address} ({first_line(err)}); "
                              "no value was released for the step in flight; once the cluster is back, resume "
                              "the run") from None

    def _replace_dead(self) -> None:
        for w, worker in enumerate(self.workers):
            try:
                ray.get(worker.pid.remote(), timeout=60)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                with contextlib.suppress(Exception):
                    ray.kill(worker)  # unreachable, not known dead: it must not come back beside its replacement
                self.workers[w] = self._start(w)  # rebuilt from the driver's parameters, in its bundle
                self.restarts += 1

    def worker_pids(self) -> List[int]:
        return ray.get([w.pid.remote() for w in self.workers])

    def close(self) -> None:
        from ray.util.placement_group import remove_placement_group

        # a lost cluster took its actors and placement group with it (and a call now would start a new Ray)
        if ray.is_initialized():
            with contextlib.suppress(ConnectionError):
                for w in self.workers:
                    ray.kill(w)
                if self._group is not None:
                    remove_placement_group(self._group)
        self.workers = []
        self._group = None
