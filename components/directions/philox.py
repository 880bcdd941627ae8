"""Direction streams on a CUDA device: counter-based (Triton's Philox), one kernel per direction.

Value j of tensor i of direction ``seed`` is drawn from the key ``keys(seed)[i]`` at counter j: a pure
function of (key, j). The keys are splitmix64 of one BLAKE2b ``public_seed(seed)`` and the tensor index
(a BLAKE2b per tensor cost 0.2 ms a draw for MiniLM's 105 tensors). So a whole direction is one launch,
any part of it (a module's tensor, the rows an embedding looked up) is drawn on its own with the same
values, and the values depend neither on the GPU model nor on launch shapes (torch's CUDA generator,
drawn chunk by chunk, takes a launch and a reseed per 32K values: 700 launches for a 22M-parameter
model, four times its forward pass).

Cache and regenerate mode draw the same values (a cached slot holds exactly what ``fill`` and ``rows``
draw), and every perturbed point and update on this path is one expression, ``_axpy``: x + s * u in
float32, rounded once. Regenerate mode computes it with u drawn in the same kernel (one launch per tensor,
nothing allocated), cache mode with u read from its slot (one launch for all tensors, through tables of
their addresses), so the two modes agree bit for bit. These streams are not the CPU's
(``Directions.stream`` names them): a run continues only on the kind of device that drew its journal.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import List, Optional, Tuple

import torch

from components.randomness import public_seed, splitmix64

try:  # ships with torch's CUDA builds; absent from CPU-only installs, which never take this path
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = None

# Bump whenever the values drawn for a key change (kernels, key derivation, Triton's Philox rounds).
PHILOX_VERSION = 1
BLOCK = 4096
_MAX_NUMEL = 2**31 - BLOCK  # counters are int32: Philox keeps the key's full 64 bits only then
_KINDS = {"gaussian": 0, "sphere": 0, "rademacher": 1}
# the kernels compute in float32: wider parameters take the chunked torch path instead
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def keys(seed: int, n: int) -> List[int]:
    """The Philox keys of tensors 0..n-1 of direction ``seed``: ``splitmix64(public_seed(seed), i)``."""
    base = public_seed(seed)
    return [splitmix64(base, i) for i in range(n)]


def key(seed: int, i: int) -> int:
    """``keys(seed, n)[i]`` for one tensor."""
    return splitmix64(public_seed(seed), i)


def available() -> bool:
    return triton is not None and torch.cuda.is_available()


def supports(params: List[torch.Tensor]) -> bool:
    """One CUDA device, one dtype of at most 32 bits, every tensor countable in int32."""
    if not params or not available():
        return False
    first = params[0]
    return (first.device.type == "cuda" and first.dtype in _DTYPES
            and all(p.device == first.device and p.dtype == first.dtype and p.numel() < _MAX_NUMEL for p in params))


if triton is not None:

    @triton.jit
    def _z(key, counters, RADEMACHER: tl.constexpr):
        if RADEMACHER:
            bits = tl.randint(key, counters)
            return (bits & 1).to(tl.float32) * 2.0 - 1.0
        return tl.randn(key, counters)

    @triton.jit
    def _u(key, counters, scale, like_ptr, RADEMACHER: tl.constexpr, SCALED: tl.constexpr):
        """The direction's values in the dtype of ``like_ptr``: rounded once, then (sphere) scaled once,
        exactly as a cached slot holds them."""
        z = _z(key, counters, RADEMACHER).to(like_ptr.dtype.element_ty)
        if SCALED:
            z = (z.to(tl.float32) * scale).to(like_ptr.dtype.element_ty)
        return z

    @triton.jit
    def _axpy(x, u, scale):
        """x + scale * u in float32, rounded once to x's dtype: every perturbed point and update here."""
        return (x.to(tl.float32) + scale * u.to(tl.float32)).to(x.dtype)

    @triton.jit
    def _axpy_kernel(dst_ptr, src_ptr, u_ptr, n, key, scale, u_scale, GENERATE: tl.constexpr,
                     RADEMACHER: tl.constexpr, SCALED: tl.constexpr, BLOCK: tl.constexpr):
        """dst = src + scale * u over n contiguous values; u read from ``u_ptr`` or (GENERATE) drawn from
        ``key`` at the same counters ``_fill_kernel`` uses."""
        counters = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = counters < n
        x = tl.load(src_ptr + counters, mask=mask)
        if GENERATE:
            u = _u(key, counters, u_scale, dst_ptr, RADEMACHER, SCALED)
        else:
            u = tl.load(u_ptr + counters, mask=mask)
        tl.store(dst_ptr + counters, _axpy(x, u, scale), mask=mask)

    @triton.jit
    def _axpy_tensors_kernel(dst_table, src_table, u_table, keys_ptr, block_tensor_ptr, block_first_ptr,
                             numels_ptr, scale, u_scale, DTYPE: tl.constexpr, GENERATE: tl.constexpr,
                             RADEMACHER: tl.constexpr, SCALED: tl.constexpr, BLOCK: tl.constexpr):
        """``_axpy_kernel`` for every tensor of the layout in one launch: tensor t's addresses are read
        from the int64 tables (dst, src, u), block b covers counters first[b].. of tensor t[b]."""
        b = tl.program_id(0)
        t = tl.load(block_tensor_ptr + b)
        counters = tl.load(block_first_ptr + b) + tl.arange(0, BLOCK)
        mask = counters < tl.load(numels_ptr + t)
        dst = tl.load(dst_table + t).to(tl.pointer_type(DTYPE))
        src = tl.load(src_table + t).to(tl.pointer_type(DTYPE))
        x = tl.load(src + counters, mask=mask)
        if GENERATE:
            u = _u(tl.load(keys_ptr + t), counters, u_scale, dst, RADEMACHER, SCALED)
        else:
            u = tl.load(tl.load(u_table + t).to(tl.pointer_type(DTYPE)) + counters, mask=mask)
        tl.store(dst + counters, _axpy(x, u, scale), mask=mask)

    @triton.jit
    def _draw_kernel(out_ptr, partial_ptr, keys_ptr, block_tensor_ptr, block_first_ptr, starts_ptr, numels_ptr,
                     RADEMACHER: tl.constexpr, WRITE: tl.constexpr, NORM: tl.constexpr, BLOCK: tl.constexpr):
        """A whole direction, unscaled, into the flat ``out`` (WRITE) and/or the float64 sum of squares
        of each block into ``partial`` (NORM): block b covers counters first[b].. of tensor t[b]."""
        b = tl.program_id(0)
        t = tl.load(block_tensor_ptr + b)
        first = tl.load(block_first_ptr + b)
        key = tl.load(keys_ptr + t)
        start = tl.load(starts_ptr + t)
        n = tl.load(numels_ptr + t)
        counters = first + tl.arange(0, BLOCK)
        mask = counters < n
        z = _z(key, counters, RADEMACHER).to(out_ptr.dtype.element_ty)
        if WRITE:
            tl.store(out_ptr + start + counters, z, mask=mask)
        if NORM:
            z64 = tl.where(mask, z.to(tl.float64), 0.0)
            tl.store(partial_ptr + b, tl.sum(z64 * z64, axis=0))

    @triton.jit
    def _scale_kernel(x_ptr, n, scale, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(x_ptr + offs, (x.to(tl.float32) * scale).to(x_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _fill_kernel(out_ptr, n, key, scale, RADEMACHER: tl.constexpr, SCALED: tl.constexpr, BLOCK: tl.constexpr):
        counters = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = counters < n
        tl.store(out_ptr + counters, _u(key, counters, scale, out_ptr, RADEMACHER, SCALED), mask=mask)

    @triton.jit
    def _rows_kernel(out_ptr, rows_ptr, dim, key, scale, RADEMACHER: tl.constexpr, SCALED: tl.constexpr,
                     BLOCK: tl.constexpr):
        """Rows ``rows`` of a [*, dim] table: out[r] = u[rows[r] * dim : (rows[r] + 1) * dim]."""
        r = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < dim
        row = tl.load(rows_ptr + r).to(tl.int32)
        u = _u(key, row * dim + cols, scale, out_ptr, RADEMACHER, SCALED)
        tl.store(out_ptr + r.to(tl.int64) * dim + cols, u, mask=mask)


class Layout:
    """The parameters as one flat vector: where each tensor starts, and the draw kernel's block table."""

    def __init__(self, params: List[torch.Tensor]):
        self.device = params[0].device
        self.dtype = params[0].dtype
        self.numels = [p.numel() for p in params]
        self.starts = []
        total = 0
        for n in self.numels:
            self.starts.append(total)
            total += n
        self.dim = total
        tensor, first = [], []
        for t, n in enumerate(self.numels):
            for f in range(0, n, BLOCK):
                tensor.append(t)
                first.append(f)
        self.n_blocks = len(tensor)
        self._block_tensor = torch.tensor(tensor, dtype=torch.int32, device=self.device)
        self._block_first = torch.tensor(first, dtype=torch.int32, device=self.device)
        self._starts = torch.tensor(self.starts, dtype=torch.int64, device=self.device)
        self._numels = torch.tensor(self.numels, dtype=torch.int32, device=self.device)
        # the keys travel through one pinned buffer (pinning per call took 0.4 ms on an H100 host); on
        # the host (Triton's interpreter, in tests) they are written in place
        gpu = self.device.type == "cuda"
        self._keys_host = torch.empty(len(self.numels), dtype=torch.int64)
        self._keys_host = self._keys_host.pin_memory() if gpu else self._keys_host
        self._keys_device = torch.empty(len(self.numels), dtype=torch.int64, device=self.device)
        self._keys_copied = torch.cuda.Event() if gpu else None
        self._lock = threading.Lock()
        self._tables: "OrderedDict[int, Tuple[List[torch.Tensor], torch.Tensor]]" = OrderedDict()
        self._triton_dtype = {torch.float32: tl.float32, torch.float16: tl.float16,
                              torch.bfloat16: tl.bfloat16}.get(self.dtype) if triton is not None else None

    def new_flat(self) -> torch.Tensor:
        with torch.inference_mode(False):
            return torch.empty(self.dim, dtype=self.dtype, device=self.device)

    def views(self, flat: torch.Tensor, params: List[torch.Tensor]) -> List[torch.Tensor]:
        return [flat[a:a + n].view(p.shape) for a, n, p in zip(self.starts, self.numels, params)]

    def draw(self, keys: List[int], kind: str, out: Optional[torch.Tensor], norm: bool) -> Optional[float]:
        """Raw direction into ``out`` (flat) if given; its squared norm (float64, summed block by block
        in a fixed order) if ``norm``."""
        target = out if out is not None else torch.empty(1, dtype=self.dtype, device=self.device)
        partials = torch.empty(self.n_blocks if norm else 1, dtype=torch.float64, device=self.device)
        with self._lock:  # a prefetch thread may draw while this one computes a norm
            _draw_kernel[(self.n_blocks,)](target, partials, self._upload_keys(keys), self._block_tensor,
                                           self._block_first, self._starts, self._numels,
                                           RADEMACHER=_KINDS[kind] == 1, WRITE=out is not None, NORM=norm,
                                           BLOCK=BLOCK)
        return float(partials.sum()) if norm else None

    def _upload_keys(self, keys: List[int]) -> torch.Tensor:
        """The keys on the device (call with the lock held): asynchronous from pinned memory (a pageable
        copy would wait for every queued kernel); the host buffer is rewritten only once its last copy is
        done, and the device buffer is read by kernels queued before the next copy on the same stream."""
        if self._keys_copied is not None:
            self._keys_copied.synchronize()
        self._keys_host.numpy()[:] = keys
        self._keys_device.copy_(self._keys_host, non_blocking=True)
        if self._keys_copied is not None:
            self._keys_copied.record()
        return self._keys_device

    def table(self, tensors: List[torch.Tensor]) -> torch.Tensor:
        """The tensors' addresses as an int64 device table, uploaded once per list. ``tensors`` must be a
        list its owner keeps and never changes (the parameters' detached views, a cache slot, the swap
        buffer): the table is found by the list's identity and holds the list, so the memory it points
        to lives as long as the table does (reading 105 addresses every call cost 20 us a table)."""
        entry = self._tables.get(id(tensors))
        if entry is not None and entry[0] is tensors:
            return entry[1]
        if len(tensors) != len(self.numels) or any(
                t.numel() != n or t.dtype != self.dtype or t.device != self.device or not t.is_contiguous()
                for t, n in zip(tensors, self.numels)):
            raise ValueError("philox: a tensor table must match the layout (numel, dtype, device, contiguous)")
        table = torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64, device=self.device)
        self._tables[id(tensors)] = (tensors, table)
        if len(self._tables) > 16:
            self._tables.popitem(last=False)
        return table

    def axpy_all_(self, dst: List[torch.Tensor], src: List[torch.Tensor], scale: float,
                  u: Optional[List[torch.Tensor]] = None, keys: Optional[List[int]] = None,
                  kind: str = "gaussian", u_scale: float = 1.0) -> None:
        """dst[t] = src[t] + scale * u[t] for every tensor of the layout, one launch; u read from the
        tensors ``u`` or drawn from ``keys`` (scaled by ``u_scale``, as a cached slot holds it)."""
        dst_table, src_table = self.table(dst), self.table(src)
        with self._lock:
            generate = u is None
            keys_device = self._upload_keys(keys) if generate else self._keys_device
            _axpy_tensors_kernel[(self.n_blocks,)](dst_table, src_table, dst_table if generate else self.table(u),
                                                   keys_device, self._block_tensor, self._block_first,
                                                   self._numels, scale, u_scale, DTYPE=self._triton_dtype,
                                                   GENERATE=generate, RADEMACHER=_KINDS[kind] == 1,
                                                   SCALED=u_scale != 1.0, BLOCK=BLOCK)


def scale_(flat: torch.Tensor, scale: float) -> None:
    n = flat.numel()
    _scale_kernel[(triton.cdiv(n, BLOCK),)](flat, n, scale, BLOCK=BLOCK)


def fill(out: torch.Tensor, key: int, kind: str, scale: float) -> torch.Tensor:
    n = out.numel()
    _fill_kernel[(triton.cdiv(n, BLOCK),)](out, n, key, scale, RADEMACHER=_KINDS[kind] == 1,
                                           SCALED=scale != 1.0, BLOCK=BLOCK)
    return out


def axpy_(dst: torch.Tensor, src: torch.Tensor, scale: float, u: Optional[torch.Tensor] = None,
          key: int = 0, kind: str = "gaussian", u_scale: float = 1.0) -> torch.Tensor:
    """dst = src + scale * u over contiguous tensors of one size (dst may be src); u read from ``u`` or
    drawn from ``key`` (scaled by ``u_scale``) in the same kernel, so nothing is allocated."""
    n = dst.numel()
    if src.numel() != n or not (dst.is_contiguous() and src.is_contiguous()) or (
            u is not None and (u.numel() != n or not u.is_contiguous())):
        raise ValueError("philox.axpy_: dst, src and u must be contiguous and of one size")
    generate = u is None
    _axpy_kernel[(triton.cdiv(n, BLOCK),)](dst, src, dst if generate else u, n, key, scale, u_scale,
                                           GENERATE=generate, RADEMACHER=_KINDS[kind] == 1,
                                           SCALED=u_scale != 1.0, BLOCK=BLOCK)
    return dst


def rows(out: torch.Tensor, unique_rows: torch.Tensor, dim: int, key: int, kind: str, scale: float) -> torch.Tensor:
    if len(unique_rows):
        _rows_kernel[(len(unique_rows), triton.cdiv(dim, BLOCK))](out, unique_rows, dim, key, scale,
                                                                  RADEMACHER=_KINDS[kind] == 1,
                                                                  SCALED=scale != 1.0, BLOCK=BLOCK)
    return out
