"""Independent jobs as Ray tasks (a search's candidates): each item of a list given to one task of a function
with a value every task shares, on this process's Ray (``ray_backend.connect``). Training runs use actors
(``ray_backend``); a task here owns nothing between calls."""
from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence, Tuple

import ray

from components.runtime.ray_backend import connect


def each_on_ray(fn: Callable, items: Sequence[Any], shared: Any, *, address: str, workers: int,
                cpus_per_worker: float, retries: int = 3) -> Iterator[Tuple[Any, Any]]:
    """``fn(item, shared, threads)`` for each item as a Ray task of ``cpus_per_worker`` CPUs (``threads`` torch
    threads), all submitted at once; yields (item, its result) in the items' order, one at a time, so a caller
    keeps only what it needs. A task lost with its worker or node is run again by Ray (``retries``)."""
    connect(address, workers * cpus_per_worker)
    shared_ref = ray.put(shared)
    task = ray.remote(fn).options(num_cpus=cpus_per_worker, max_retries=retries)
    threads = max(1, int(cpus_per_worker))
    refs = [task.remote(item, shared_ref, threads) for item in items]
    del shared_ref
    for item, ref in zip(items, refs):
        yield item, ray.get(ref)
