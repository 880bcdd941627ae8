"""Independent jobs as Ray tasks (a search's candidates): each item of a list given to one task of a function
with a value every task shares, on this process's Ray (``ray_backend.connect``). Training runs use actors
(``ray_backend``); a task here owns nothing between calls."""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import ray

from components.runtime.ray_backend import connect, first_line
from components.runtime.workers import WorkersNotReady

PACKAGES = ("specs", "components", "flows")


def packages() -> Dict[str, str]:
    """Where this process imports privzo's packages from."""
    return {name: str(Path(importlib.import_module(name).__file__).resolve().parent) for name in PACKAGES}


def each_on_ray(fn: Callable, items: Sequence[Any], shared: Any, *, address: str, workers: int,
                cpus_per_worker: float, retries: int = 3, check: Optional[Callable[[Any, int], Any]] = None,
                ready: Callable[[List[Any]], None] = lambda checked: None) -> Iterator[Tuple[Any, Any]]:
    """``fn(item, shared, threads)`` for each item as a Ray task of ``cpus_per_worker`` CPUs (``threads`` torch
    threads), all submitted at once; yields (item, its result) in the items' order, one at a time, so a caller
    keeps only what it needs. A task lost with its worker or node is run again by Ray (``retries``).

    First, before ``shared`` leaves this process, one task a worker says where it imports privzo from: a
    worker that cannot, or imports another package of that name, raises ``WorkersNotReady`` in one line.
    Then, with ``check``, ``check(shared, threads)`` runs as one task a worker (spread over the nodes) and
    ``ready`` is given what they returned, before any task of ``fn`` is submitted: what a caller must refuse
    before its work starts (a search is charged whole from then) it refuses there. Without ``check``,
    ``ready([])`` is called before ``shared`` is sent."""
    connect(address, workers * cpus_per_worker)
    here = packages()
    probe = ray.remote(packages).options(num_cpus=cpus_per_worker, scheduling_strategy="SPREAD", max_retries=0)
    try:
        found = ray.get([probe.remote() for _ in range(max(1, workers))])
    except ray.exceptions.RayError as err:
        cause = getattr(err, "cause", None)  # a task's error: what its function raised
        said = first_line(cause if isinstance(cause, BaseException) else err).split(". ")[0]  # not Ray's sys.path
        raise WorkersNotReady(f"execution: Ray's workers cannot run privzo ({said}); nothing was sent to them") \
            from None
    other = next((f for f in found if f != here), None)
    if other is not None:
        name = next(n for n in PACKAGES if other[n] != here[n])
        raise WorkersNotReady(f"execution: Ray's workers import {name} from {other[name]}, this process from "
                              f"{here[name]}; nothing was sent to them")
    threads = max(1, int(cpus_per_worker))
    checked: List[Any] = []
    shared_ref = None
    if check is not None:
        shared_ref = ray.put(shared)
        checker = ray.remote(check).options(num_cpus=cpus_per_worker, scheduling_strategy="SPREAD",
                                            max_retries=retries)
        checked = ray.get([checker.remote(shared_ref, threads) for _ in range(max(1, workers))])
    ready(checked)
    shared_ref = ray.put(shared) if shared_ref is None else shared_ref
    task = ray.remote(fn).options(num_cpus=cpus_per_worker, max_retries=retries)
    refs = [task.remote(item, shared_ref, threads) for item in items]
    del shared_ref
    for item, ref in zip(items, refs):
        yield item, ray.get(ref)
