"""The two generators of a direction's values, behind one interface (``Streams``): ``ChunkStreams``, the chunked
seeded torch streams (``chunks.py``), on a CPU and wherever the kernels cannot run, and ``PhiloxStreams``, the
counter-based kernels of a CUDA device (``philox.py``). ``Directions`` takes one at construction
(``streams_for``) and hands it every draw; its cache slots, prefetch and perturbed forwards are the same for both.

Methods that may find the direction cached take it as ``u`` (a slot's tensor, or the slot): each generator
has its own arithmetic on a cached operand (a torch op on a CPU, the kernels' ``_axpy`` on a GPU), the one
its regenerated values go through, so that on each the two modes agree bit for bit.
"""
from __future__ import annotations

import abc
import bisect
import math
from collections import OrderedDict
from typing import Callable, Dict, List, Optional, Set, Tuple

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
    run_tasks,
    sum_squares,
)
from components.randomness import public_seed

# (module, parameter name, tensor index) of each direction tensor a model's modules own
Owners = List[Tuple[nn.Module, str, int]]


def row_lookup(module: nn.Module) -> bool:
    """A plain embedding table: its forward reads only the rows of its input ids, so its perturbation is
    added to those rows (W[ids] + s * V[ids] == (W + s * V)[ids]) instead of to the whole table. Tables
    with ``max_norm`` (which rewrite W in forward) or a custom forward go the general way."""
    return (isinstance(module, nn.Embedding) and type(module).forward is nn.Embedding.forward
            and module.max_norm is None)


def streams_for(params: List[torch.Tensor], kind: str, radius: float) -> "Streams":
    """The kernels where they can draw these tensors (one CUDA device, a dtype of at most 32 bits), else the
    chunked streams."""
    if philox.supports(params):
        return PhiloxStreams(params, kind, radius)
    return ChunkStreams(params, kind, radius)


class Streams(abc.ABC):
    """What ``Directions`` asks of a generator. Tensor i of direction ``seed`` is a pure function of (seed, i)
    and the generator; a sphere direction is the raw draw z scaled by radius / ||z||, whose norms are kept
    here for the last 256 seeds."""

    def __init__(self, params: List[torch.Tensor], kind: str, radius: float):
        self.params = params
        self.kind = kind
        self.radius = radius
        self.norms: "OrderedDict[int, float]" = OrderedDict()  # seed -> ||z|| for the sphere

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """The stream a journal of (seed, coefficient) replays on (``Directions.stream``)."""

    def scale(self, seed: int) -> float:
        """What the raw draw of ``seed`` is multiplied by: radius / ||z|| for the sphere, else 1."""
        return self.radius / self.sphere_norm(seed) if self.kind == "sphere" else 1.0

    def sphere_norm(self, seed: int) -> float:
        norm = self.norms.get(seed)
        if norm is None:
            norm = self._norm_pass(seed)
            self.remember_norm(seed, norm)
        return norm

    def remember_norm(self, seed: int, norm: float) -> None:
        self.norms[seed] = norm
        if len(self.norms) > 256:
            self.norms.popitem(last=False)

    def tensor(self, seed: int, i: int) -> torch.Tensor:
        """Tensor i of ``seed`` drawn into a fresh contiguous tensor."""
        return self.fill(seed, i, torch.empty_like(self.params[i], memory_format=torch.contiguous_format))

    @abc.abstractmethod
    def _norm_pass(self, seed: int) -> float:
        """||z|| of the raw draw of ``seed``, drawn for it alone."""

    @abc.abstractmethod
    def new_slot(self) -> List[torch.Tensor]:
        """Buffers for one cached direction, shaped like the tensors."""

    @abc.abstractmethod
    def draw_slot(self, seed: int, slot: List[torch.Tensor]) -> Optional[float]:
        """Direction ``seed``, scaled, into ``slot`` on the calling thread (the prefetch's: nothing kept here
        is touched); its sphere norm, for the caller to remember."""

    @abc.abstractmethod
    def draw_slots(self, seeds: List[int], slots: List[List[torch.Tensor]]) -> None:
        """Directions ``seeds``, scaled, into ``slots`` (a cache mode step), their sphere norms remembered."""

    @abc.abstractmethod
    def fill(self, seed: int, i: int, out: torch.Tensor) -> torch.Tensor:
        """Tensor i of direction ``seed`` into ``out`` (shaped like parameter i)."""

    @abc.abstractmethod
    def perturb(self, seed: int, i: int, p: torch.Tensor, out: torch.Tensor, scale: float,
                u: Optional[torch.Tensor]) -> None:
        """out = p + scale * u_i(seed); ``u``: the cached tensor, if any."""

    @abc.abstractmethod
    def perturb_span(self, seed: int, i: int, p: torch.Tensor, src: torch.Tensor, start: int, stop: int,
                     out: torch.Tensor, scale: float) -> None:
        """The 1-D ``out`` = ``src`` (elements [start, stop) of p, flattened) + scale * those of u_i(seed):
        the values ``perturb`` writes there."""

    @abc.abstractmethod
    def add(self, seed: int, i: int, target: torch.Tensor, alpha: float, u: Optional[torch.Tensor]) -> None:
        """target += alpha * u_i(seed), allocating nothing where it can; ``u``: the cached tensor, if any."""

    @abc.abstractmethod
    def add_all(self, seed: int, targets: List[torch.Tensor], alpha: float,
                u: Optional[List[torch.Tensor]]) -> None:
        """targets[i] += alpha * u_i(seed) for every tensor, as ``add`` does; ``u``: the cached slot, if any.
        ``targets`` is a list its owner keeps (an address table may be kept for it)."""

    @abc.abstractmethod
    def rows(self, seed: int, i: int, unique: torch.Tensor, out: torch.Tensor) -> None:
        """The rows ``unique`` (sorted, distinct) of tensor i, a 2-D table, into ``out``."""

    @abc.abstractmethod
    def add_rows(self, out: torch.Tensor, rows: torch.Tensor, scale: float) -> torch.Tensor:
        """An embedding's looked-up rows of W plus scale * the same rows of u: (W + scale * u)[ids] as the
        whole-point swap computes it."""

    @abc.abstractmethod
    def swap_point(self, owners: Owners, detached: List[torch.Tensor], u: List[torch.Tensor],
                   scale: float) -> Tuple[List[Optional[torch.Tensor]], Set[int]]:
        """Cache mode's whole perturbed point: buffers kept across steps holding detached[i] + scale * u[i],
        and the tensors left out (plain embedding tables, whose looked-up rows are perturbed instead)."""


class ChunkStreams(Streams):
    """Chunked seeded torch streams: each tensor cut into chunks of ``CHUNK`` elements, each chunk its own
    stream, drawn in any order or thread with the same values (``chunks.py``). In regenerate mode updates,
    sphere norms and embedding rows are drawn a chunk at a time."""

    def __init__(self, params: List[torch.Tensor], kind: str, radius: float):
        super().__init__(params, kind, radius)
        # (start, length) of each chunk of each tensor, flattened; and the chunks' stream seeds of the last few
        # directions (a regenerate step draws each chunk three times: both points and the update)
        self._spans = [[(c * CHUNK, min(CHUNK, p.numel() - c * CHUNK)) for c in range(max(1, math.ceil(p.numel() / CHUNK)))]
                       for p in params]
        self._seed_lists: "OrderedDict[int, List[Optional[List[int]]]]" = OrderedDict()
        # the last chunk a span cut at its end, and whose it was: (seed, tensor, chunk)
        self._cut: Optional[torch.Tensor] = None
        self._cut_at: Optional[Tuple[int, int, int]] = None
        self._swap: Optional[List[Optional[torch.Tensor]]] = None  # cache mode's perturbed point, per tensor

    @property
    def name(self) -> str:
        return f"{self.params[0].device.type if self.params else 'cpu'}-torch-v{GENERATOR_VERSION}"

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

    def _norm_pass(self, seed: int) -> float:
        # one extra generation pass, a chunk at a time, to get ||z|| over the whole direction
        parts: Dict[Tuple[int, int], torch.Tensor] = {}
        for i in range(len(self.params)):
            self._chunkwise(seed, i, lambda c, _a, buf, i=i: parts.__setitem__((i, c), chunk_norm(buf)))
        return math.sqrt(sum_squares([parts[key] for key in sorted(parts)]))

    def _norm_of_slot(self, slot: List[torch.Tensor]) -> float:
        """||z|| of a drawn direction, summed per chunk in the order ``_norm_pass`` uses."""
        norms = []
        for i, buf in enumerate(slot):
            flat = buf.view(-1)
            norms.extend(chunk_norm(flat[a:a + n]) for a, n in self._chunks(i))
        return math.sqrt(sum_squares(norms))

    def new_slot(self) -> List[torch.Tensor]:
        return [long_lived(p.shape, p.device, p.dtype) for p in self.params]

    def draw_slot(self, seed: int, slot: List[torch.Tensor]) -> Optional[float]:
        # one chunk at a time on this thread, the sphere's norm and scaling too, in ``draw_slots``' order
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

    def draw_slots(self, seeds: List[int], slots: List[List[torch.Tensor]]) -> None:
        # every chunk of every direction in parallel
        tasks = []
        for seed, slot in zip(seeds, slots):
            for i, buf in enumerate(slot):
                tasks.extend(self._fill_tasks(seed, i, buf))
        if tasks:
            run_tasks(tasks, self.params[0].device)
        for seed, slot in zip(seeds, slots):
            if self.kind == "sphere" and seed not in self.norms:
                # the raw direction is already here: its norm needs no second generation pass
                self.remember_norm(seed, self._norm_of_slot(slot))
            scale = self.scale(seed)
            if scale != 1.0:
                for buf in slot:
                    buf.mul_(scale)

    def fill(self, seed: int, i: int, out: torch.Tensor) -> torch.Tensor:
        if len(self._spans[i]) == 1:  # most tensors: one chunk, drawn here without task bookkeeping
            draw_seeded(self.kind, self._chunk_seeds(seed, i)[0], out.view(-1))
        else:
            run_tasks(self._fill_tasks(seed, i, out), out.device)
        scale = self.scale(seed)
        if scale != 1.0:
            out.mul_(scale)
        return out

    def perturb(self, seed: int, i: int, p: torch.Tensor, out: torch.Tensor, scale: float,
                u: Optional[torch.Tensor]) -> None:
        if u is not None:
            torch.add(p, u, alpha=scale, out=out)
        else:
            self.fill(seed, i, out)
            torch.add(p, out, alpha=scale, out=out)  # same op as the cached path: identical values

    def perturb_span(self, seed: int, i: int, p: torch.Tensor, src: torch.Tensor, start: int, stop: int,
                     out: torch.Tensor, scale: float) -> None:
        self._span(seed, i, start, stop, out)
        torch.add(src, out, alpha=scale, out=out)  # perturb's op, element by element

    def _span(self, seed: int, i: int, start: int, stop: int, out: torch.Tensor) -> None:
        """Elements [start, stop) of tensor i of direction ``seed`` into the 1-D ``out``: only the chunks
        holding them are drawn, and scaled after as ``fill`` scales the whole tensor."""

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
        scale = self.scale(seed)
        if scale != 1.0:
            out.mul_(scale)

    def add(self, seed: int, i: int, target: torch.Tensor, alpha: float, u: Optional[torch.Tensor]) -> None:
        if u is not None:
            target.add_(u, alpha=alpha)
            return
        if not target.is_contiguous():
            target.add_(self.tensor(seed, i), alpha=alpha)
            return
        # regenerated a chunk at a time: no d-sized or tensor-sized scratch for updates
        scale = self.scale(seed)
        flat = target.view(-1)

        def consume(_c: int, a: int, buf: torch.Tensor) -> None:
            if scale != 1.0:
                buf.mul_(scale)
            flat[a:a + buf.numel()].add_(buf, alpha=alpha)

        self._chunkwise(seed, i, consume)

    def add_all(self, seed: int, targets: List[torch.Tensor], alpha: float,
                u: Optional[List[torch.Tensor]]) -> None:
        if u is not None:
            for i, target in enumerate(targets):
                self.add(seed, i, target, alpha, u[i])
            return
        # regenerated: ``add``'s chunks and ops, in one loop over every tensor
        scale, kind = self.scale(seed), self.kind
        with torch.no_grad():
            for i, target in enumerate(targets):
                spans = self._spans[i]
                if not target.is_contiguous() or in_parallel(target.device, len(spans), target.numel()):
                    self.add(seed, i, target, alpha, None)
                    continue
                flat, scratch = target.view(-1), chunk_scratch(target.device, target.dtype)
                for chunk, (a, n) in zip(self._chunk_seeds(seed, i), spans):
                    buf = scratch if n == CHUNK else scratch[:n]
                    draw_seeded(kind, chunk, buf)
                    if scale != 1.0:
                        buf.mul_(scale)
                    (flat if n == flat.numel() else flat[a:a + n]).add_(buf, alpha=alpha)

    def rows(self, seed: int, i: int, unique: torch.Tensor, out: torch.Tensor) -> None:
        # each drawn chunk hands over the wanted rows it holds: those wholly inside it by one index_select
        # over the chunk seen as rows (an index a row, not an element: int64 positions of every element were
        # four times the rows' own bytes at bf16), the at most two it cuts by a copy of their part
        dim = self.params[i].shape[1]
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
        scale = self.scale(seed)
        if scale != 1.0:
            out.mul_(scale)

    def add_rows(self, out: torch.Tensor, rows: torch.Tensor, scale: float) -> torch.Tensor:
        return torch.add(out, rows, alpha=scale)

    def swap_point(self, owners: Owners, detached: List[torch.Tensor], u: List[torch.Tensor],
                   scale: float) -> Tuple[List[Optional[torch.Tensor]], Set[int]]:
        # each tensor one torch.add (regenerate mode's op); a plain table is left to its rows, unless tied
        # to another module's weight (an LM head): then it is swapped whole for both
        row_only: Dict[int, bool] = {}
        for m, _n, i in owners:
            row_only[i] = row_only.get(i, True) and row_lookup(m)
        tables = {i for i, only in row_only.items() if only}
        copied = [i for i in row_only if i not in tables]
        if self._swap is None:
            self._swap = [None] * len(self.params)
        for i in copied:
            if self._swap[i] is None:
                p = self.params[i]
                self._swap[i] = long_lived(p.shape, p.device, p.dtype)
        views = self._swap
        for i in copied:
            torch.add(detached[i], u[i], alpha=scale, out=views[i])
        return views, tables


class _Slot(list):
    """A cached direction's tensors, views of one flat buffer (``flat``)."""

    flat: torch.Tensor


class PhiloxStreams(Streams):
    """Counter-based streams on a CUDA device (``philox.py``): one kernel draws a whole direction, any tensor
    or embedding row on its own with the same values, and every perturbed point and update is the kernels'
    ``_axpy`` (u drawn in the kernel, or read from a cache slot: the same values either way)."""

    def __init__(self, params: List[torch.Tensor], kind: str, radius: float):
        super().__init__(params, kind, radius)
        self.layout = philox.Layout(params)
        self._key_lists: "OrderedDict[int, List[int]]" = OrderedDict()
        self._all_contiguous: Optional[bool] = None
        self._swap: Optional[List[torch.Tensor]] = None  # cache mode's perturbed point, one flat buffer

    @property
    def name(self) -> str:
        return f"cuda-philox-v{philox.PHILOX_VERSION}"

    def _keys(self, seed: int) -> List[int]:
        """The Philox key of every tensor of direction ``seed``, kept for the last few seeds (a regenerated
        perturbed forward asks once per tensor)."""
        keys = self._key_lists.get(seed)
        if keys is None:
            keys = self._key_lists[seed] = philox.keys(seed, len(self.params))
            if len(self._key_lists) > 8:
                self._key_lists.popitem(last=False)
        return keys

    def _contiguous(self) -> bool:
        if self._all_contiguous is None:
            self._all_contiguous = all(p.is_contiguous() for p in self.params)
        return self._all_contiguous

    def _axpy_(self, seed: int, i: int, dst: torch.Tensor, src: torch.Tensor, scale: float,
               u: Optional[torch.Tensor]) -> None:
        """dst = src + scale * u_i(seed) (contiguous), u the cached tensor or drawn in the same kernel."""
        if u is not None:
            philox.axpy_(dst, src, scale, u=u)
        else:
            philox.axpy_(dst, src, scale, key=self._keys(seed)[i], kind=self.kind, u_scale=self.scale(seed))

    def _norm_pass(self, seed: int) -> float:
        return math.sqrt(self.layout.draw(self._keys(seed), self.kind, None, norm=True))

    def new_slot(self) -> List[torch.Tensor]:
        # one flat buffer seen as the tensors: a whole direction is one launch
        flat = self.layout.new_flat()
        slot = _Slot(self.layout.views(flat, self.params))
        slot.flat = flat
        return slot

    def draw_slot(self, seed: int, slot: List[torch.Tensor]) -> Optional[float]:
        sphere = self.kind == "sphere"
        # not the memo of ``_keys``: this may run on the prefetch thread
        squares = self.layout.draw(philox.keys(seed, len(self.params)), self.kind, slot.flat, norm=sphere)
        if not sphere:
            return None
        norm = math.sqrt(squares)
        philox.scale_(slot.flat, self.radius / norm)
        return norm

    def draw_slots(self, seeds: List[int], slots: List[List[torch.Tensor]]) -> None:
        for seed, slot in zip(seeds, slots):
            norm = self.draw_slot(seed, slot)
            if norm is not None:
                self.remember_norm(seed, norm)

    def fill(self, seed: int, i: int, out: torch.Tensor) -> torch.Tensor:
        if not out.is_contiguous():
            return out.copy_(self.tensor(seed, i))
        return philox.fill(out, self._keys(seed)[i], self.kind, self.scale(seed))

    def perturb(self, seed: int, i: int, p: torch.Tensor, out: torch.Tensor, scale: float,
                u: Optional[torch.Tensor]) -> None:
        # one launch drawing u and writing p + scale * u: the arithmetic of the cached swap
        if not p.is_contiguous():
            p = out.copy_(p)
        self._axpy_(seed, i, out, p, scale, u)

    def perturb_span(self, seed: int, i: int, p: torch.Tensor, src: torch.Tensor, start: int, stop: int,
                     out: torch.Tensor, scale: float) -> None:
        # the span is whole rows of p's last dimension: drawn as an embedding table's are (``rows``), then
        # the cached swap's arithmetic
        dim = p.shape[-1] if p.dim() > 1 else 1
        rows = torch.arange(start // dim, stop // dim, device=p.device)
        philox.rows(out, rows, dim, self._keys(seed)[i], self.kind, self.scale(seed))
        philox.axpy_(out, src.contiguous(), scale, u=out)

    def add(self, seed: int, i: int, target: torch.Tensor, alpha: float, u: Optional[torch.Tensor]) -> None:
        # drawn inside the add's kernel (nothing allocated); the arithmetic of ``add_all``
        flat = target if target.is_contiguous() else target.contiguous()
        self._axpy_(seed, i, flat, flat, alpha, u)
        if flat is not target:
            target.copy_(flat)

    def add_all(self, seed: int, targets: List[torch.Tensor], alpha: float,
                u: Optional[List[torch.Tensor]]) -> None:
        if not self._contiguous():
            for i, target in enumerate(targets):
                self.add(seed, i, target, alpha, None if u is None else u[i])
            return
        # every tensor in one launch, u read from the cache or drawn in the kernel
        if u is not None:
            self.layout.axpy_all_(targets, targets, alpha, u=u)
        else:
            self.layout.axpy_all_(targets, targets, alpha, keys=self._keys(seed), kind=self.kind,
                                  u_scale=self.scale(seed))

    def rows(self, seed: int, i: int, unique: torch.Tensor, out: torch.Tensor) -> None:
        # counter-based: any row is drawn on its own, no chunk bookkeeping
        philox.rows(out, unique, self.params[i].shape[1], self._keys(seed)[i], self.kind, self.scale(seed))

    def add_rows(self, out: torch.Tensor, rows: torch.Tensor, scale: float) -> torch.Tensor:
        # the arithmetic of the cached swap, row by row: (W + s V)[ids] exactly
        return philox.axpy_(torch.empty_like(out, memory_format=torch.contiguous_format), out.contiguous(),
                            scale, u=rows.contiguous())

    def swap_point(self, owners: Owners, detached: List[torch.Tensor], u: List[torch.Tensor],
                   scale: float) -> Tuple[List[Optional[torch.Tensor]], Set[int]]:
        # every tensor, tables too, written by one launch into one flat buffer
        if self._swap is None:
            self._swap = self.new_slot()
        self.layout.axpy_all_(self._swap, detached, scale, u=u)
        return self._swap, set()
