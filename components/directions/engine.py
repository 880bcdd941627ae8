"""The direction engine: public random directions regenerated from integer seeds (forward passes at
perturbed points: ``perturbation.py``; the generators of their values: ``streams.py``).

A direction u is never stored whole unless the run asks for cache mode: tensor i of direction ``seed``
is regenerated whenever it is needed (MeZO's memory trick), by one of two generators with one interface
(``streams.Streams``). On a CPU each tensor is cut into fixed chunks of ``CHUNK`` elements, each chunk with
its own stream derived from (seed, i, chunk) (``chunks.py``); so tensors and chunks can be produced in any
order or in parallel threads (module hooks, replicas, replays) with identical values. On a CUDA device the
chunks give way to counter-based streams (``philox.py``): one kernel draws a whole direction, and cache mode
swaps every parameter for a whole perturbed copy written by one launch. ``Directions.stream`` names which
generator a run's journal needs.

Generation writes into buffers that live as long as the ``Directions`` object (cache slots, the
perturbation stack) or the thread (one chunk each): fresh d-sized allocations cost page faults that, on
CPU, take longer than the arithmetic itself.
"""
from __future__ import annotations

import contextlib
import math
import weakref
from concurrent.futures import Future
from typing import Dict, Iterator, List, Optional, Tuple

import torch
from torch import nn

from components.directions.chunks import long_lived, prefetch_thread
from components.directions.streams import Streams, streams_for


class Directions:
    """Directions over a fixed list of parameter tensors.

    kinds: ``gaussian`` (N(0, I_d), E[uu^T] = I), ``rademacher`` (+-1 entries, E[uu^T] = I),
    ``sphere`` (uniform on radius * S^{d-1}; radius sqrt(d) gives E[uu^T] = I as in DPZero).

    The values come from one generator, picked here for the tensors' device and dtype (``streams_for``);
    this class keeps what both share: cache slots, the prefetch, the perturbation stack, and which modules
    own which tensors.
    """

    def __init__(self, params: List[torch.Tensor], kind: str = "gaussian", radius: Optional[float] = None):
        if kind not in ("gaussian", "sphere", "rademacher"):
            raise ValueError(f"estimator.directions: unknown {kind!r}; allowed: gaussian, sphere, rademacher")
        self.params = list(params)
        self.kind = kind
        self.dim = sum(p.numel() for p in self.params)
        self.radius = math.sqrt(self.dim) if radius is None else float(radius)
        self._slots: List[List[torch.Tensor]] = []  # cache-mode buffers, reused step after step
        self._cache: Dict[int, List[torch.Tensor]] = {}  # seed -> its slot, only inside ``cached``
        self._spare: List[List[torch.Tensor]] = []  # cache slots free for a prefetch
        # (seeds, future of their sphere norms, slots) of a prefetch not yet taken over by ``cached``
        self._pending: Optional[Tuple[Tuple[int, ...], "Future[List[Optional[float]]]", List[List[torch.Tensor]]]] = None
        self._pools: Dict[Tuple[torch.device, torch.dtype], "_Stack"] = {}
        self._capacities: Dict[int, Dict] = {}  # id(model) -> scratch needed by a perturbed forward
        self._splits: Dict[int, Dict[int, int]] = {}  # id(model) -> its Linear layers perturbed in blocks
        self._streams: Streams = streams_for(self.params, kind, self.radius)
        self._detached_params: Optional[List[torch.Tensor]] = None
        self._index: Optional[Dict[int, int]] = None
        self._owned_lists: Dict[int, Tuple["weakref.ref", list]] = {}
        # tensor -> (seed, ids, their index among the distinct rows, the rows of u drawn for them) of its last draw
        self._last_rows: Dict[int, Tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._owner_lists: Dict[int, Tuple["weakref.ref", List[Tuple[nn.Module, str, int]]]] = {}

    @property
    def stream(self) -> str:
        """Which generator draws these directions: a journal of (seed, coefficient) replays only on the
        same one (checkpoints record it; a resume on another is refused)."""
        return self._streams.name

    def _scale(self, seed: int) -> float:
        """What the raw draw of ``seed`` is multiplied by (a sphere's norm pass, the first time)."""
        return self._streams.scale(seed)

    def _cached_tensor(self, seed: int, i: int) -> Optional[torch.Tensor]:
        cached = self._cache.get(seed)
        return None if cached is None else cached[i]

    def perturb_into(self, seed: int, i: int, p: torch.Tensor, out: torch.Tensor, scale: float) -> None:
        """out = p + scale * u_i(seed), the perturbed forward's parameter tensor."""
        self._streams.perturb(seed, i, p, out, scale, self._cached_tensor(seed, i))

    def perturb_span_into(self, seed: int, i: int, p: torch.Tensor, start: int, stop: int, out: torch.Tensor,
                          scale: float) -> None:
        """out = elements [start, stop) of p + scale * u_i(seed), flattened: the values ``perturb_into`` writes
        there (the same elementwise ops on the same operands). On the philox path the span is whole rows of
        p's last dimension."""
        flat = out.view(-1)
        src = p.reshape(-1)[start:stop]
        cached = self._cache.get(seed)
        if cached is not None:
            torch.add(src, cached[i].reshape(-1)[start:stop], alpha=scale, out=flat)
        else:
            self._streams.perturb_span(seed, i, p, src, start, stop, flat, scale)

    def fill_(self, seed: int, i: int, out: torch.Tensor) -> torch.Tensor:
        """Write tensor ``i`` of direction ``seed`` into ``out`` (shaped like parameter i)."""
        cached = self._cache.get(seed)
        if cached is not None:
            return out.copy_(cached[i])
        return self._streams.fill(seed, i, out)

    def tensor(self, seed: int, i: int) -> torch.Tensor:
        """Tensor ``i`` of direction ``seed`` (shared in cache mode: do not modify it)."""
        cached = self._cache.get(seed)
        if cached is not None:
            return cached[i]
        return self.fill_(seed, i, torch.empty_like(self.params[i], memory_format=torch.contiguous_format))

    def add_to_(self, seed: int, i: int, target: torch.Tensor, alpha: float) -> None:
        """target += alpha * u_i(seed), without allocating: from the cache slot, or regenerated (a chunk at a
        time on a CPU, inside the add's kernel on a GPU: regenerate mode keeps no d-sized or tensor-sized
        scratch for updates)."""
        self._streams.add(seed, i, target, alpha, self._cached_tensor(seed, i))

    def add_all_(self, seed: int, alpha: float) -> None:
        """params += alpha * u(seed), tensor by tensor as ``add_to_`` (on a GPU one launch for all of them,
        with the arithmetic of ``add_to_``)."""
        self._streams.add_all(seed, self.detached(), alpha, self._cache.get(seed))

    def detached(self) -> List[torch.Tensor]:
        """The parameters as plain tensors sharing their storage (kept: 105 detaches cost 75 us a step)."""
        if self._detached_params is None:
            self._detached_params = [p.detach() for p in self.params]
        return self._detached_params

    @property
    def index_of(self) -> Dict[int, int]:
        """id(parameter) -> its index among the directions' tensors."""
        if self._index is None:
            self._index = {id(p): i for i, p in enumerate(self.params)}
        return self._index

    def owned_by_module(self, model: nn.Module) -> List[Tuple[nn.Module, List[Tuple[str, torch.Tensor]]]]:
        """(module, [(name, parameter)]) of every module of ``model`` owning direction tensors, in
        ``model.modules()`` order; kept per model (a perturbed forward asks twice a step)."""
        known = self._owned_lists.get(id(model))
        if known is not None and known[0]() is model:  # an id is only reused by another model once freed
            return known[1]
        index = self.index_of
        owned = [(m, [(n, p) for n, p in m._parameters.items() if p is not None and id(p) in index])
                 for m in model.modules()]
        owned = [(m, o) for m, o in owned if o]
        self._owned_lists[id(model)] = (weakref.ref(model), owned)
        return owned

    def _owners(self, model: nn.Module) -> List[Tuple[nn.Module, str, int]]:
        """(module, name, index) of every direction tensor in ``model``; each must be a module's own."""
        known = self._owner_lists.get(id(model))
        if known is not None and known[0]() is model:  # an id is only reused by another model once freed
            return known[1]
        index = {id(p): i for i, p in enumerate(self.params)}
        owners = [(m, n, index[id(p)]) for m in model.modules() for n, p in m._parameters.items()
                  if p is not None and id(p) in index]
        if len({i for _, _, i in owners}) != len(self.params):
            raise RuntimeError("perturbed forward: some trainable parameter tensors are not parameters of the "
                               "model's modules; freeze them (requires_grad=False)")
        self._owner_lists[id(model)] = (weakref.ref(model), owners)
        return owners

    @contextlib.contextmanager
    def swapped(self, model: nn.Module, seed: int, scale: float) -> Iterator[None]:
        """Cache mode: the model runs at x + scale * u(seed) with its parameters swapped at once for
        buffers holding the perturbed values; no per-module hooks, whose Python costs more than a small
        model's forward (on a GPU, more than MiniLM's). x is never written; +d memory.

        On a GPU every tensor is written by one launch into one flat buffer (``philox._axpy``, the
        arithmetic of regenerate mode's per-tensor kernel, so identical values). On a CPU each
        tensor is one ``torch.add`` (the op regenerate mode uses, so identical values), and a plain
        embedding table is not swapped: the rows its forward looked up get scale * u added, as in
        ``perturbed``'s hook path."""
        owners = self._owners(model)
        views, tables = self._streams.swap_point(owners, self.detached(), self._cache[seed], scale)
        swap = [o for o in owners if o[2] not in tables]
        handles = []
        try:
            handles.extend(m.register_forward_hook(row_hook(self, seed, i, scale))
                           for m, _n, i in owners if i in tables)
            for module, name, i in swap:
                module._parameters[name] = views[i]
            yield
        finally:
            for h in handles:
                h.remove()
            for module, name, i in swap:
                module._parameters[name] = self.params[i]

    def rows(self, seed: int, i: int, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of tensor i (a 2-D embedding table) of direction ``seed``, shaped ids.shape + (dim,):
        only the rows wanted are drawn (on a CPU, only the chunks holding them), into a buffer the size of
        the distinct rows."""
        cached = self._cache.get(seed)
        if cached is not None:
            return nn.functional.embedding(ids, cached[i])
        last = self._last_rows.get(i)
        if last is not None and last[0] == seed and last[1].shape == ids.shape and torch.equal(last[1], ids):
            # the other point of the same query: its forward looks up the same ids (one draw of them a step)
            return nn.functional.embedding(last[2], last[3])
        p = self.params[i]
        unique, inverse = torch.unique(ids.reshape(-1), sorted=True, return_inverse=True)
        with torch.inference_mode(False):
            out = torch.empty(len(unique), p.shape[1], device=p.device, dtype=p.dtype)
        self._streams.rows(seed, i, unique, out)
        # kept (the distinct rows only, and which id is which) until this table's next draw
        inverse = inverse.view(ids.shape)
        self._last_rows[i] = (seed, ids.clone(), inverse, out)
        return nn.functional.embedding(inverse, out)

    def iter_tensors(self, seed: int) -> Iterator[torch.Tensor]:
        for i in range(len(self.params)):
            yield self.tensor(seed, i)

    def dense(self, seed: int) -> List[torch.Tensor]:
        """The whole direction materialised (tests and diagnostics)."""
        return list(self.iter_tensors(seed))

    @contextlib.contextmanager
    def cached(self, seeds) -> Iterator[None]:
        """Cache mode: generate each direction once per step (on a CPU all chunks in parallel, on a GPU one
        launch), into buffers kept across steps, and reuse it for the +lambda and -lambda points and the
        update (+d memory per direction, one RNG pass)."""
        seeds = list(dict.fromkeys(seeds))
        ready = self._take_prefetched(tuple(seeds))
        if ready is not None:
            # the prefetched slots become this step's; the ones they replace become spare
            self._spare.extend(self._slots[:len(seeds)])
            self._slots = ready + self._slots[len(seeds):]
            for seed, slot in zip(seeds, ready):
                self._cache[seed] = slot
            seeds = []
        while len(self._slots) < len(seeds):
            self._slots.append(self._streams.new_slot())
        self._streams.draw_slots(seeds, self._slots[:len(seeds)])
        for seed, slot in zip(seeds, self._slots):
            self._cache[seed] = slot
        try:
            yield
        finally:
            self._cache.clear()

    def prefetch(self, seeds) -> None:
        """Start drawing ``seeds`` (the next step's directions) on a background thread, into spare cache
        slots, while this step's forward passes run; the ``cached`` call for exactly these seeds takes
        them over, and any other call discards them. The values are bit for bit those ``cached`` draws:
        same streams, and the sphere's norm and scaling (on a CPU chunk by chunk) in the same order. Every
        op on that thread is one chunk, below torch's intra-op grain, so it never starts an OpenMP team.
        +d memory per direction on top of cache mode's."""
        seeds = tuple(dict.fromkeys(seeds))
        self._discard_prefetch()
        if not seeds:
            return
        while len(self._spare) < len(seeds):
            self._spare.append(self._streams.new_slot())
        slots, self._spare = self._spare[:len(seeds)], self._spare[len(seeds):]
        streams = self._streams
        future = prefetch_thread().submit(lambda: [streams.draw_slot(seed, slot) for seed, slot in zip(seeds, slots)])
        self._pending = (seeds, future, slots)

    def _take_prefetched(self, seeds: Tuple[int, ...]) -> Optional[List[List[torch.Tensor]]]:
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        wanted, future, slots = pending
        norms = future.result()  # waits; re-raises a failed draw here
        if wanted != seeds:
            self._spare.extend(slots)
            return None
        for seed, norm in zip(wanted, norms):
            if norm is not None and seed not in self._streams.norms:
                self._streams.remember_norm(seed, norm)
        return slots

    def _discard_prefetch(self) -> None:
        self._take_prefetched(())

    def stack(self, p: torch.Tensor, capacity: int) -> "_Stack":
        key = (p.device, p.dtype)
        stack = self._pools.get(key)
        if stack is None or stack.capacity < capacity:
            if stack is not None and stack.offset:
                raise RuntimeError("directions: scratch stack resized while in use")
            stack = self._pools[key] = _Stack(capacity, p.device, p.dtype)
        return stack


class _Stack:
    """LIFO scratch for perturbed parameters: nested module calls take and give back in order."""

    def __init__(self, capacity: int, device: torch.device, dtype: torch.dtype):
        self.capacity = capacity
        self.buffer = long_lived(capacity, device, dtype)
        self.offset = 0

    def take(self, like: torch.Tensor) -> torch.Tensor:
        return self.take_shape(like.shape)

    def take_shape(self, shape) -> torch.Tensor:
        n = math.prod(shape)
        if self.offset + n > self.capacity:
            raise RuntimeError("perturbed forward: scratch stack exhausted (a module ran outside its parent)")
        view = self.buffer[self.offset:self.offset + n].view(shape)
        self.offset += n
        return view

    def give_back(self, like: torch.Tensor) -> None:
        self.offset -= like.numel()


def row_hook(directions: "Directions", direction, i: int, scale: float, seen: Optional[set] = None):
    """Forward hook of a plain embedding table (tensor i): its output rows get scale * v[ids] added,
    which equals looking the ids up in W + scale * v (v: a seed, ``Seeded`` or ``Dense``)."""
    seed = direction if isinstance(direction, int) else getattr(direction, "seed", None)
    p = directions.params[i]

    def post(_module, args, out):
        ids = args[0]
        if seed is None:
            rows = nn.functional.embedding(ids, direction.tensor(i))
        else:
            rows = directions.rows(seed, i, ids)
        if seen is not None:
            seen.add(id(p))
        if seed is None:
            return torch.add(out, rows, alpha=scale)
        return directions._streams.add_rows(out, rows, scale)  # the arithmetic of the generator's swap

    return post
