"""The direction engine: public random directions regenerated from integer seeds (forward passes at
perturbed points: ``perturbation.py``; the chunked CPU streams: ``chunks.py``).

A direction u is never stored whole unless the run asks for cache mode: tensor i of direction ``seed``
is regenerated whenever it is needed (MeZO's memory trick). Each tensor is cut into fixed chunks of
``CHUNK`` elements, each chunk with its own stream derived from (seed, i, chunk); so tensors and chunks
can be produced in any order or in parallel threads (module hooks, replicas, replays) with identical
values.

Generation writes into buffers that live as long as the ``Directions`` object (cache slots, the
perturbation stack) or the thread (one chunk each): fresh d-sized allocations cost page faults that, on
CPU, take longer than the arithmetic itself. In regenerate mode updates, sphere norms and embedding rows
are drawn a chunk at a time.

On a CUDA device the chunks give way to counter-based streams (``philox.py``): one kernel draws a whole
direction, and cache mode swaps every parameter for a whole perturbed copy instead of hooking each module
(``Directions.swapped``). ``Directions.stream`` names which generator a run's journal needs.
"""
from __future__ import annotations

import bisect
import contextlib
import math
import weakref
from collections import OrderedDict
from concurrent.futures import Future
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import torch
from torch import nn

import components.directions.philox as philox
from components.directions.chunks import (
    CHUNK,
    GENERATOR_VERSION,
    chunk_norm,
    chunk_scratch,
    chunk_seed,
    draw_chunk,
    draw_seeded,
    in_parallel,
    long_lived,
    prefetch_thread,
    run_tasks,
    sum_squares,
)
from components.randomness import public_seed


class Directions:
    """Directions over a fixed list of parameter tensors.

    kinds: ``gaussian`` (N(0, I_d), E[uu^T] = I), ``rademacher`` (+-1 entries, E[uu^T] = I),
    ``sphere`` (uniform on radius * S^{d-1}; radius sqrt(d) gives E[uu^T] = I as in DPZero).
    """

    def __init__(self, params: List[torch.Tensor], kind: str = "gaussian", radius: Optional[float] = None):
        if kind not in ("gaussian", "sphere", "rademacher"):
            raise ValueError(f"estimator.directions: unknown {kind!r}; allowed: gaussian, sphere, rademacher")
        self.params = list(params)
        self.kind = kind
        self.dim = sum(p.numel() for p in self.params)
        self.radius = math.sqrt(self.dim) if radius is None else float(radius)
        self._norms: "OrderedDict[int, float]" = OrderedDict()  # seed -> ||z|| for the sphere (scalars only)
        self._slots: List[List[torch.Tensor]] = []  # cache-mode buffers, reused step after step
        self._cache: Dict[int, List[torch.Tensor]] = {}  # seed -> its slot, only inside ``cached``
        self._spare: List[List[torch.Tensor]] = []  # cache slots free for a prefetch
        # (seeds, future of their sphere norms, slots) of a prefetch not yet taken over by ``cached``
        self._pending: Optional[Tuple[Tuple[int, ...], "Future[List[Optional[float]]]", List[List[torch.Tensor]]]] = None
        self._pools: Dict[Tuple[torch.device, torch.dtype], "_Stack"] = {}
        self._capacities: Dict[int, Dict] = {}  # id(model) -> scratch needed by a perturbed forward
        self._splits: Dict[int, Dict[int, int]] = {}  # id(model) -> its Linear layers perturbed in blocks
        # on a CUDA device: counter-based streams, one kernel per direction (philox.py)
        self._philox: Optional[philox.Layout] = philox.Layout(self.params) if philox.supports(self.params) else None
        self._swap: Optional[List[Optional[torch.Tensor]]] = None  # cache mode's perturbed point
        self._detached_params: Optional[List[torch.Tensor]] = None
        self._index: Optional[Dict[int, int]] = None
        self._owned_lists: Dict[int, Tuple["weakref.ref", list]] = {}
        # tensor -> (seed, ids, their index among the distinct rows, the rows of u drawn for them) of its last draw
        self._last_rows: Dict[int, Tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        # the last chunk a span cut at its end, and whose it was: (seed, tensor, chunk)
        self._cut: Optional[torch.Tensor] = None
        self._cut_at: Optional[Tuple[int, int, int]] = None
        self._owner_lists: Dict[int, Tuple["weakref.ref", List[Tuple[nn.Module, str, int]]]] = {}
        self._key_lists: "OrderedDict[int, List[int]]" = OrderedDict()
        # (start, length) of each chunk of each tensor, flattened; and the chunks' stream seeds of the last few
        # directions (a regenerate step draws each chunk three times: both points and the update)
        self._spans = [[(c * CHUNK, min(CHUNK, p.numel() - c * CHUNK)) for c in range(max(1, math.ceil(p.numel() / CHUNK)))]
                       for p in self.params]
        self._seed_lists: "OrderedDict[int, List[Optional[List[int]]]]" = OrderedDict()
        self._all_contiguous: Optional[bool] = None

    @property
    def stream(self) -> str:
        """Which generator draws these directions: a journal of (seed, coefficient) replays only on the
        same one (checkpoints record it; a resume on another is refused)."""
        if self._philox is not None:
            return f"cuda-philox-v{philox.PHILOX_VERSION}"
        return f"{self.params[0].device.type if self.params else 'cpu'}-torch-v{GENERATOR_VERSION}"

    def _keys(self, seed: int) -> List[int]:
        """The Philox key of every tensor of direction ``seed``, kept for the last few seeds (a regenerated
        perturbed forward asks once per tensor)."""
        keys = self._key_lists.get(seed)
        if keys is None:
            keys = self._key_lists[seed] = philox.keys(seed, len(self.params))
            if len(self._key_lists) > 8:
                self._key_lists.popitem(last=False)
        return keys

    def _new_slot(self) -> List[torch.Tensor]:
        """Buffers for one cached direction; on the philox path one flat buffer seen as the tensors."""
        if self._philox is None:
            return [long_lived(p.shape, p.device, p.dtype) for p in self.params]
        flat = self._philox.new_flat()
        slot = _Slot(self._philox.views(flat, self.params))
        slot.flat = flat
        return slot

    def _philox_draw(self, seed: int, slot: "_Slot") -> Optional[float]:
        """Direction ``seed`` into a flat slot, scaled; its sphere norm."""
        sphere = self.kind == "sphere"
        # not the memo of ``_keys``: this may run on the prefetch thread
        squares = self._philox.draw(philox.keys(seed, len(self.params)), self.kind, slot.flat, norm=sphere)
        if not sphere:
            return None
        norm = math.sqrt(squares)
        philox.scale_(slot.flat, self.radius / norm)
        return norm

    def perturb_into(self, seed: int, i: int, p: torch.Tensor, out: torch.Tensor, scale: float) -> None:
        """out = p + scale * u_i(seed), the perturbed forward's parameter tensor."""
        cached = self._cache.get(seed)
        if self._philox is not None:
            # one launch drawing u and writing p + scale * u: the arithmetic of the cached swap
            if not p.is_contiguous():
                p = out.copy_(p)
            self._philox_axpy_(seed, i, out, p, scale)
        elif cached is not None:
            torch.add(p, cached[i], alpha=scale, out=out)
        else:
            self.fill_(seed, i, out)
            torch.add(p, out, alpha=scale, out=out)  # same op as the cached path: identical values

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
        elif self._philox is not None:
            # the rows drawn as an embedding table's are (``row_hook``), then the cached swap's arithmetic
            dim = p.shape[-1] if p.dim() > 1 else 1
            rows = torch.arange(start // dim, stop // dim, device=p.device)
            philox.rows(flat, rows, dim, self._keys(seed)[i], self.kind, self._scale(seed))
            philox.axpy_(flat, src.contiguous(), scale, u=flat)
        else:
            self._span(seed, i, start, stop, flat)
            torch.add(src, flat, alpha=scale, out=flat)  # perturb_into's op, element by element

    def _span(self, seed: int, i: int, start: int, stop: int, out: torch.Tensor) -> None:
        """Elements [start, stop) of tensor i of direction ``seed`` into the 1-D ``out``: only the chunks
        holding them are drawn, and scaled after as ``fill_`` scales the whole tensor."""

        wanted = list(range(start // CHUNK, (stop - 1) // CHUNK + 1))

        def consume(c: int, a: int, buf: torch.Tensor) -> None:
            lo, hi = max(a, start), min(a + buf.numel(), stop)
            out[lo - start:hi - start].copy_(buf[lo - a:hi - a])
            if hi < a + buf.numel():
                # the next block (a large Linear layer's rows, in order) starts inside this chunk: kept, so
                # that no chunk is drawn twice
                if self._cut is None:
                    self._cut = long_lived(CHUNK, buf.device, buf.dtype)
                self._cut[:buf.numel()].copy_(buf)
                self._cut_at = (seed, i, c)

        if self._cut_at == (seed, i, wanted[0]):
            a, n = self._spans[i][wanted[0]]
            consume(wanted[0], a, self._cut[:n])
            wanted = wanted[1:]
        if wanted:
            self._chunkwise(seed, i, consume, wanted)
        scale = self._scale(seed)
        if scale != 1.0:
            out.mul_(scale)

    def _philox_axpy_(self, seed: int, i: int, dst: torch.Tensor, src: torch.Tensor, scale: float) -> None:
        """dst = src + scale * u_i(seed) (contiguous), u from the cache or drawn in the same kernel."""
        cached = self._cache.get(seed)
        if cached is not None:
            philox.axpy_(dst, src, scale, u=cached[i])
        else:
            philox.axpy_(dst, src, scale, key=self._keys(seed)[i], kind=self.kind, u_scale=self._scale(seed))

    # ------------------------------------------------------------------ generation
    def _draw(self, base: int, c: int, out: torch.Tensor) -> None:
        draw_chunk(self.kind, base, c, out)

    def _chunks(self, i: int) -> List[Tuple[int, int]]:
        """(start, length) of each chunk of parameter i, flattened."""
        return self._spans[i]

    def _chunk_seeds(self, seed: int, i: int) -> List[int]:
        """The stream seed of each chunk of tensor i of direction ``seed``, kept for the last few seeds. Only
        the calling thread's: the prefetch thread derives its own."""
        per_tensor = self._seed_lists.get(seed)
        if per_tensor is None:
            per_tensor = self._seed_lists[seed] = [None] * len(self.params)
            if len(self._seed_lists) > 8:
                self._seed_lists.popitem(last=False)
        seeds = per_tensor[i]
        if seeds is None:
            base = public_seed(seed, i)
            seeds = per_tensor[i] = [chunk_seed(base, c) for c in range(len(self._spans[i]))]
        return seeds

    def _fill_tasks(self, seed: int, i: int, out: torch.Tensor) -> List[Tuple[int, Callable[[], None]]]:
        kind, flat = self.kind, out.view(-1)
        return [(n, lambda s=s, a=a, n=n: draw_seeded(kind, s, flat[a:a + n]))
                for s, (a, n) in zip(self._chunk_seeds(seed, i), self._spans[i])]

    def _scale(self, seed: int) -> float:
        return self.radius / self._sphere_norm(seed) if self.kind == "sphere" else 1.0

    def fill_(self, seed: int, i: int, out: torch.Tensor) -> torch.Tensor:
        """Write tensor ``i`` of direction ``seed`` into ``out`` (shaped like parameter i)."""
        cached = self._cache.get(seed)
        if cached is not None:
            return out.copy_(cached[i])
        if self._philox is not None:
            if not out.is_contiguous():
                return out.copy_(self.tensor(seed, i))
            return philox.fill(out, self._keys(seed)[i], self.kind, self._scale(seed))
        if len(self._spans[i]) == 1:  # most tensors: one chunk, drawn here without task bookkeeping
            draw_seeded(self.kind, self._chunk_seeds(seed, i)[0], out.view(-1))
        else:
            run_tasks(self._fill_tasks(seed, i, out), out.device)
        scale = self._scale(seed)
        if scale != 1.0:
            out.mul_(scale)
        return out

    def _chunkwise(self, seed: int, i: int, consume: Callable[[int, int, torch.Tensor], None],
                   chunks: Optional[List[int]] = None) -> None:
        """Draw the raw chunks of tensor i of ``seed`` (all, or those listed) one at a time into a
        per-thread buffer and hand each to ``consume(index, start, values)``: nothing d-sized is allocated."""
        p = self.params[i]
        seeds, spans, kind = self._chunk_seeds(seed, i), self._spans[i], self.kind
        wanted = range(len(spans)) if chunks is None else chunks
        if not in_parallel(p.device, len(wanted), sum(spans[c][1] for c in wanted)):
            with torch.no_grad():  # writes to parameters are never tracked
                scratch = chunk_scratch(p.device, p.dtype)
                for c in wanted:
                    a, n = spans[c]
                    buf = scratch if n == CHUNK else scratch[:n]
                    draw_seeded(kind, seeds[c], buf)
                    consume(c, a, buf)
            return

        def task(c: int) -> None:
            a, n = spans[c]
            with torch.no_grad():  # grad mode is per thread: pool threads would track writes to parameters
                buf = chunk_scratch(p.device, p.dtype)[:n]
                draw_seeded(kind, seeds[c], buf)
                consume(c, a, buf)

        run_tasks([(spans[c][1], lambda c=c: task(c)) for c in wanted], p.device)

    def _sphere_norm(self, seed: int) -> float:
        norm = self._norms.get(seed)
        if norm is None and self._philox is not None:
            norm = math.sqrt(self._philox.draw(self._keys(seed), self.kind, None, norm=True))
            self._remember_norm(seed, norm)
        if norm is None:
            # one extra generation pass, a chunk at a time, to get ||z|| over the whole direction
            parts: Dict[Tuple[int, int], torch.Tensor] = {}
            for i in range(len(self.params)):
                self._chunkwise(seed, i, lambda c, _a, buf, i=i: parts.__setitem__((i, c), chunk_norm(buf)))
            norm = math.sqrt(sum_squares([parts[key] for key in sorted(parts)]))
            self._remember_norm(seed, norm)
        return norm

    def _remember_norm(self, seed: int, norm: float) -> None:
        self._norms[seed] = norm
        if len(self._norms) > 256:
            self._norms.popitem(last=False)

    def _norm_of_slot(self, slot: List[torch.Tensor]) -> float:
        """||z|| of a drawn direction, summed per chunk in the order ``_sphere_norm`` uses."""
        norms = []
        for i, buf in enumerate(slot):
            flat = buf.view(-1)
            norms.extend(chunk_norm(flat[a:a + n]) for a, n in self._chunks(i))
        return math.sqrt(sum_squares(norms))

    def tensor(self, seed: int, i: int) -> torch.Tensor:
        """Tensor ``i`` of direction ``seed`` (shared in cache mode: do not modify it)."""
        cached = self._cache.get(seed)
        if cached is not None:
            return cached[i]
        return self.fill_(seed, i, torch.empty_like(self.params[i], memory_format=torch.contiguous_format))

    def add_to_(self, seed: int, i: int, target: torch.Tensor, alpha: float) -> None:
        """target += alpha * u_i(seed), without allocating: from the cache slot, or regenerated a chunk at
        a time (regenerate mode keeps no d-sized or tensor-sized scratch for updates)."""
        cached = self._cache.get(seed)
        if self._philox is not None:
            # drawn inside the add's kernel (nothing allocated); the arithmetic of ``add_all_``
            flat = target if target.is_contiguous() else target.contiguous()
            self._philox_axpy_(seed, i, flat, flat, alpha)
            if flat is not target:
                target.copy_(flat)
            return
        if cached is not None:
            target.add_(cached[i], alpha=alpha)
            return
        if not target.is_contiguous():
            target.add_(self.tensor(seed, i), alpha=alpha)
            return
        scale = self._scale(seed)
        flat = target.view(-1)

        def consume(_c: int, a: int, buf: torch.Tensor) -> None:
            if scale != 1.0:
                buf.mul_(scale)
            flat[a:a + buf.numel()].add_(buf, alpha=alpha)

        self._chunkwise(seed, i, consume)

    def add_all_(self, seed: int, alpha: float) -> None:
        """params += alpha * u(seed), tensor by tensor as ``add_to_`` (on a GPU one launch for all of them,
        with the arithmetic of ``add_to_``)."""
        cached = self._cache.get(seed)
        if self._philox is not None and self._contiguous():
            # every tensor in one launch, u read from the cache or drawn in the kernel
            params = self.detached()
            if cached is not None:
                self._philox.axpy_all_(params, params, alpha, u=cached)
            else:
                self._philox.axpy_all_(params, params, alpha, keys=self._keys(seed), kind=self.kind,
                                       u_scale=self._scale(seed))
            return
        if cached is not None or self._philox is not None:
            for i, target in enumerate(self.detached()):
                self.add_to_(seed, i, target, alpha)
            return
        # regenerate mode on a CPU: ``add_to_``'s chunks and ops, in one loop over every tensor
        scale, kind = self._scale(seed), self.kind
        with torch.no_grad():
            for i, target in enumerate(self.detached()):
                spans = self._spans[i]
                if not target.is_contiguous() or in_parallel(target.device, len(spans), target.numel()):
                    self.add_to_(seed, i, target, alpha)
                    continue
                flat, scratch = target.view(-1), chunk_scratch(target.device, target.dtype)
                for chunk, (a, n) in zip(self._chunk_seeds(seed, i), spans):
                    buf = scratch if n == CHUNK else scratch[:n]
                    draw_seeded(kind, chunk, buf)
                    if scale != 1.0:
                        buf.mul_(scale)
                    (flat if n == flat.numel() else flat[a:a + n]).add_(buf, alpha=alpha)

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

    def _contiguous(self) -> bool:
        if self._all_contiguous is None:
            self._all_contiguous = all(p.is_contiguous() for p in self.params)
        return self._all_contiguous

    def _swap_views(self, indices: List[int]) -> List[Optional[torch.Tensor]]:
        """Scratch for a whole perturbed point (cache mode), kept across steps: on a GPU one flat buffer
        for every tensor, on a CPU one buffer per swapped tensor (embedding tables are not swapped)."""
        if self._swap is None:
            self._swap = self._new_slot() if self._philox is not None else [None] * len(self.params)
        for i in indices:
            if self._swap[i] is None:
                p = self.params[i]
                self._swap[i] = long_lived(p.shape, p.device, p.dtype)
        return self._swap

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
        tables: set = set()
        if self._philox is not None:
            views = self._swap_views([])
            self._philox.axpy_all_(views, self.detached(), scale, u=self._cache[seed])
        else:
            # a table tied to another module's weight (an LM head) is swapped whole for both
            row_only: Dict[int, bool] = {}
            for m, _n, i in owners:
                row_only[i] = row_only.get(i, True) and row_lookup(m)
            tables = {i for i, only in row_only.items() if only}
            copied = [i for i in row_only if i not in tables]
            views = self._swap_views(copied)
            detached, cached = self.detached(), self._cache[seed]
            for i in copied:
                torch.add(detached[i], cached[i], alpha=scale, out=views[i])
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
        only the chunks holding those rows are drawn, into a buffer the size of the distinct rows."""
        cached = self._cache.get(seed)
        if cached is not None:
            return nn.functional.embedding(ids, cached[i])
        last = self._last_rows.get(i)
        if last is not None and last[0] == seed and last[1].shape == ids.shape and torch.equal(last[1], ids):
            # the other point of the same query: its forward looks up the same ids (one draw of them a step)
            return nn.functional.embedding(last[2], last[3])
        p = self.params[i]
        dim = p.shape[1]
        unique, inverse = torch.unique(ids.reshape(-1), sorted=True, return_inverse=True)
        with torch.inference_mode(False):
            out = torch.empty(len(unique), dim, device=p.device, dtype=p.dtype)
        if self._philox is not None:  # counter-based: any row is drawn on its own, no chunk bookkeeping
            philox.rows(out, unique, dim, self._keys(seed)[i], self.kind, self._scale(seed))
            return self._kept_rows(seed, i, ids, inverse, out)
        # each drawn chunk hands over the wanted rows it holds: those wholly inside it by one index_select
        # over the chunk seen as rows (an index a row, not an element: int64 positions of every element were
        # four times the rows' own bytes at bf16), the at most two it cuts by a copy of their part
        wanted = unique.tolist()
        out2d, flat = out.view(len(wanted), dim), out.view(-1)
        chunks = sorted({c for r in wanted for c in range(r * dim // CHUNK, ((r + 1) * dim - 1) // CHUNK + 1)})

        def consume(_c: int, a: int, buf: torch.Tensor) -> None:
            n = buf.numel()
            inside0, inside1 = -(-a // dim), (a + n) // dim  # rows [inside0, inside1) lie wholly in the chunk
            j0, j1 = bisect.bisect_left(wanted, inside0), bisect.bisect_left(wanted, inside1)
            if j1 > j0:
                local = unique[j0:j1] - inside0
                torch.index_select(buf[inside0 * dim - a:inside1 * dim - a].view(-1, dim), 0, local, out=out2d[j0:j1])
            for r in {a // dim, (a + n - 1) // dim}:
                j = bisect.bisect_left(wanted, r)
                if not inside0 <= r < inside1 and j < len(wanted) and wanted[j] == r:
                    lo, hi = max(r * dim, a), min((r + 1) * dim, a + n)
                    flat[j * dim + lo - r * dim:j * dim + hi - r * dim].copy_(buf[lo - a:hi - a])

        self._chunkwise(seed, i, consume, chunks)
        scale = self._scale(seed)
        if scale != 1.0:
            out.mul_(scale)
        return self._kept_rows(seed, i, ids, inverse, out)

    def _kept_rows(self, seed: int, i: int, ids: torch.Tensor, inverse: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The drawn rows looked up by ``ids``; kept (the distinct rows only, and which id is which) until this
        table's next draw."""
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
        """Cache mode: generate each direction once per step, all chunks in parallel, into buffers kept
        across steps, and reuse it for the +lambda and -lambda points and the update (+d memory per
        direction, one RNG pass)."""
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
            self._slots.append(self._new_slot())
        if self._philox is not None:
            for seed, slot in zip(seeds, self._slots):
                norm = self._philox_draw(seed, slot)
                if norm is not None:
                    self._remember_norm(seed, norm)
                self._cache[seed] = slot
            seeds = []
        tasks = []
        for seed, slot in zip(seeds, self._slots):
            for i, buf in enumerate(slot):
                tasks.extend(self._fill_tasks(seed, i, buf))
        if tasks:
            run_tasks(tasks, self.params[0].device)
        for seed, slot in zip(seeds, self._slots):
            if self.kind == "sphere" and seed not in self._norms:
                # the raw direction is already here: its norm needs no second generation pass
                self._remember_norm(seed, self._norm_of_slot(slot))
            scale = self._scale(seed)
            if scale != 1.0:
                for buf in slot:
                    buf.mul_(scale)
            self._cache[seed] = slot
        try:
            yield
        finally:
            self._cache.clear()

    def prefetch(self, seeds) -> None:
        """Start drawing ``seeds`` (the next step's directions) on a background thread, into spare cache
        slots, while this step's forward passes run; the ``cached`` call for exactly these seeds takes
        them over, and any other call discards them. The values are bit for bit those ``cached`` draws:
        same chunk streams, and the sphere's norm and scaling chunk by chunk in the same order. Every op
        on that thread is one chunk, below torch's intra-op grain, so it never starts an OpenMP team.
        +d memory per direction on top of cache mode's."""
        seeds = tuple(dict.fromkeys(seeds))
        self._discard_prefetch()
        if not seeds:
            return
        while len(self._spare) < len(seeds):
            self._spare.append(self._new_slot())
        slots, self._spare = self._spare[:len(seeds)], self._spare[len(seeds):]
        future = prefetch_thread().submit(lambda: [self._draw_slot(seed, slot) for seed, slot in zip(seeds, slots)])
        self._pending = (seeds, future, slots)

    def _draw_slot(self, seed: int, slot: List[torch.Tensor]) -> Optional[float]:
        """Direction ``seed`` into ``slot``, one chunk at a time on the calling thread; its sphere norm."""
        if self._philox is not None:
            return self._philox_draw(seed, slot)
        with torch.no_grad():  # grad mode is per thread
            for i, buf in enumerate(slot):
                flat, base = buf.view(-1), public_seed(seed, i)
                for c, (a, n) in enumerate(self._chunks(i)):
                    self._draw(base, c, flat[a:a + n])
            if self.kind != "sphere":
                return None
            norm = self._norm_of_slot(slot)
            scale = self.radius / norm
            for i, buf in enumerate(slot):
                flat = buf.view(-1)
                for a, n in self._chunks(i):
                    flat[a:a + n].mul_(scale)
            return norm

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
            if norm is not None and seed not in self._norms:
                self._remember_norm(seed, norm)
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


class _Slot(list):
    """A cached direction's tensors, views of one flat buffer (``flat``)."""

    flat: torch.Tensor


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


def row_lookup(module: nn.Module) -> bool:
    """A plain embedding table: its forward reads only the rows of its input ids, so its perturbation is
    added to those rows (W[ids] + s * V[ids] == (W + s * V)[ids]) instead of to the whole table. Tables
    with ``max_norm`` (which rewrite W in forward) or a custom forward go the general way."""
    return (isinstance(module, nn.Embedding) and type(module).forward is nn.Embedding.forward
            and module.max_norm is None)


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
        if seed is not None and directions._philox is not None:
            # the arithmetic of the cached swap, row by row: (W + s V)[ids] exactly
            return philox.axpy_(torch.empty_like(out, memory_format=torch.contiguous_format), out.contiguous(),
                                scale, u=rows.contiguous())
        return torch.add(out, rows, alpha=scale)

    return post
