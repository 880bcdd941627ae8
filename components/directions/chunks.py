"""The chunked CPU streams of privzo's directions and the scratch and threads that draw them.

Each parameter tensor is cut into fixed chunks of ``CHUNK`` elements, each chunk drawn from its own stream
(seeded from the tensor's stream base and the chunk's index), so chunks can be drawn in any order, in any
thread, with identical values. Buffers live as long as their owner or thread: fresh d-sized allocations cost
page faults that, on a CPU, take longer than the arithmetic itself.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, List, Optional, Tuple

import torch

from components.randomness import splitmix64

# A chunk is at most torch's intra-op grain (32,768 elements), so its arithmetic runs serially on the
# thread that drew it: an op above the grain on a pool thread starts an OpenMP team of its own there,
# which slows every later forward pass of the process about 2x on a 2-core machine.
CHUNK = 1 << 15
# Below ~2M elements a step draws faster on one thread: a pool thread competes with torch's own
# intra-op threads still spinning from the last forward (measured on the 301K-parameter bench MLP).
PARALLEL_MIN = 1 << 21
# Bump whenever the values drawn for a given seed change (chunk size, stream derivation, kernels):
# checkpoints and trained models record it, and a resume across versions is refused, since a journal
# of (seed, coefficient) only means something with the generator that wrote it. 2: 32,768-element chunks.
GENERATOR_VERSION = 2
_local = threading.local()
_executor: Optional[ThreadPoolExecutor] = None
_prefetcher: Optional[ThreadPoolExecutor] = None
_executor_lock = threading.Lock()


def long_lived(size, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A long-lived buffer: allocated as a normal tensor even inside inference mode, so it can be
    written in place later outside it."""
    with torch.inference_mode(False):
        return torch.empty(size, device=device, dtype=dtype)


def chunk_norm(t: torch.Tensor) -> torch.Tensor:
    """float64 norm of one chunk, left on its device (the same reduction wherever a direction's norm is
    computed)."""
    return torch.linalg.vector_norm(t, dtype=torch.float64)


def sum_squares(norms: List[torch.Tensor]) -> float:
    """sum of the squared chunk norms, in the order given: one host transfer for all of them (a GPU would
    otherwise wait for the host once per chunk)."""
    if not norms:
        return 0.0
    return sum(v ** 2 for v in torch.stack([n.reshape(()) for n in norms]).cpu().tolist())


def thread_generator(device: torch.device) -> torch.Generator:
    gens = getattr(_local, "gens", None)
    if gens is None:
        gens = _local.gens = {}
    gen = gens.get(device)
    if gen is None:
        gen = gens[device] = torch.Generator(device=device)
    return gen


def chunk_scratch(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """One chunk of scratch per thread, for work that needs a chunk of a direction at a time."""
    bufs = getattr(_local, "chunks", None)
    if bufs is None:
        bufs = _local.chunks = {}
    buf = bufs.get((device, dtype))
    if buf is None:
        buf = bufs[(device, dtype)] = long_lived(CHUNK, device, dtype)
    return buf


def threads() -> int:
    """Threads that draw a large direction: the calling one plus up to three from the pool, within torch's
    own thread count (``execution.threads``: a run given one thread draws on one)."""
    return min(4, os.cpu_count() or 1, torch.get_num_threads())


def pool() -> Optional[ThreadPoolExecutor]:
    """Pool threads for CPU generation (torch releases the GIL inside kernels)."""
    global _executor
    if threads() < 2:
        return None
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=threads() - 1, thread_name_prefix="privzo-directions")
    return _executor


def prefetch_thread() -> ThreadPoolExecutor:
    """The one background thread that draws the next step's directions (``Directions.prefetch``)."""
    global _prefetcher
    with _executor_lock:
        if _prefetcher is None:
            _prefetcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="privzo-prefetch")
    return _prefetcher


def in_parallel(device: torch.device, tasks: int, elements: int) -> bool:
    """Whether ``run_tasks`` would hand these tasks to the pool (else they run inline, in order)."""
    return device.type == "cpu" and tasks > 1 and elements >= PARALLEL_MIN and threads() > 1


def run_tasks(tasks: List[Tuple[int, Callable[[], None]]], device: torch.device) -> None:
    """Run (elements, fn) tasks: inline when small, else in contiguous groups of about equal size, one
    group on this thread and the others on the pool (one dispatch per group, not per chunk)."""
    total = sum(n for n, _ in tasks)
    executor = pool() if in_parallel(device, len(tasks), total) else None
    if executor is None:
        for _, fn in tasks:
            fn()
        return
    n_groups = min(len(tasks), threads())
    groups: List[List[Callable[[], None]]] = [[] for _ in range(n_groups)]
    done = 0
    for n, fn in tasks:
        groups[min(n_groups - 1, done * n_groups // total)].append(fn)
        done += n

    def run_group(group):
        for fn in group:
            fn()

    futures = [executor.submit(run_group, g) for g in groups[1:] if g]
    try:
        run_group(groups[0])
    finally:
        for f in futures:
            f.result()


def draw_chunk(kind: str, base: int, c: int, out: torch.Tensor) -> None:
    """Chunk ``c`` of the tensor whose stream base is ``base``, into the 1-D ``out`` of the chunk's exact
    length (the values of a draw depend on its length)."""
    draw_seeded(kind, splitmix64(base, c), out)


def chunk_seed(base: int, c: int) -> int:
    """The seed of chunk ``c``'s stream (``draw_chunk`` draws from it)."""
    return splitmix64(base, c)


def draw_seeded(kind: str, seed: int, out: torch.Tensor) -> None:
    """A chunk whose stream seed (``chunk_seed``) is already known: ``draw_chunk``'s values."""
    gen = thread_generator(out.device)
    gen.manual_seed(seed)
    if kind == "rademacher":
        out.random_(0, 2, generator=gen).mul_(2).sub_(1)
    else:
        out.normal_(generator=gen)
