"""The ``execution`` section: where the forward passes run (this process or Ray actors) and on what device."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, PositiveInt

from specs.base import Strict


class ExecutionSpec(Strict):
    backend: Literal["local", "ray"] = Field(
        "local", description="local: forward passes in this process; ray: on Ray actors holding replicas.")
    workers: PositiveInt = Field(2, description="Ray worker actors (backend: ray).")
    gpus_per_worker: float = Field(0.0, ge=0.0, description="GPUs each worker reserves in its placement bundle.")
    cpus_per_worker: float = Field(1.0, gt=0.0, description="CPUs each worker reserves in its placement bundle.")
    workers_per_node: Optional[PositiveInt] = Field(
        None, description="Exactly this many workers on each of workers / workers_per_node nodes (a STRICT_SPREAD "
        "placement group: one bundle a node); default: one bundle a worker, spread across the nodes (SPREAD).")
    address: str = Field("local", min_length=1,
                         description="local: start Ray here; auto: join the running cluster; ray://host:port: a remote one.")
    parallelism: Literal["data", "directions"] = Field(
        "data", description="data: split each private batch across workers; directions: split the queries.")
    checksum_every: PositiveInt = Field(100, description="Steps between replica parameter checksums.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto: cuda when torch sees a GPU (with backend ray only if gpus_per_worker > 0), "
        "else cpu. A GPU draws other directions than the CPU for the same seeds: a run resumes only on the "
        "kind of device that started it.")
    threads: Optional[PositiveInt] = Field(None, description="torch intra-op threads, which also bound the threads "
                                           "drawing a direction; default: torch's choice.")
    prefetch_directions: bool = Field(
        False, description="Cache mode: draw the next step's directions on a background thread while this "
        "step's forward passes run (+q*d memory). Pays off on CPU when drawing costs as much as the "
        "forwards (small models) and ``threads`` leaves that thread a core; results are identical.")
