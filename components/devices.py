"""Where a run's model lives, and how much of its directions may be cached: what the memory plan reads too,
without the builders (validating a language model's spec imports no algorithm family)."""
from __future__ import annotations

import torch

# cache mode by default (estimator.perturbation: auto) while the cached directions and the perturbed copy
# fit in this many bytes
CACHE_LIMIT_BYTES = 512 * 2**20


def device_for(spec) -> torch.device:
    """Where the model and its directions live. With Ray, ``auto`` takes a GPU only when the workers get
    GPUs too: the driver's replica and the workers' must draw directions on the same kind of device (a
    GPU's streams are not the CPU's), and the workers are sent the driver's choice."""
    ex = spec.execution
    wanted = ex.device
    if wanted == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("execution.device: cuda requested but no CUDA device is available; use auto or cpu")
    if wanted == "auto":
        gpus = torch.cuda.is_available() and (ex.backend == "local" or ex.gpus_per_worker > 0)
        return torch.device("cuda" if gpus else "cpu")
    return torch.device(wanted)
