"""Where a regenerate-mode step's time goes, on a GPU or the CPU: one step of a Llama decoder under
torch.profiler, with what a profile's table does not show.

For ``--steps`` steps after ``--warmup`` (default one each) of regenerate mode (TwoPointEstimator(1, 1e-3),
Gaussian directions, bench/decoder_step.py's decoder and rows), prints one JSON line with:

- ``step_ms`` of each profiled step, and of the same step unprofiled just before;
- ``triton_compiles``: how many kernels Triton compiled during the measured steps, per kernel of
  components/directions/philox.py (its per-device kernel caches, before and after): a kernel recompiled for
  each key or size would show here;
- ``host_syncs``: the synchronisations torch reported under ``torch.cuda.set_sync_debug_mode("warn")``;
- ``allocations``: torch's allocation count and the bytes it requested during the measured steps (GPU);
- ``launches``: the device kernels launched, by name (the profiler's CUDA activity);
then the profiler's table of the ops by self time (device and host). ``--trace DIR`` also writes a Chrome
trace there.

    PYTHONPATH=. python bench/regenerate_profile.py --device cuda --shape 1b --batch 16 --length 128
    PYTHONPATH=. python bench/regenerate_profile.py --device cpu --shape w128-l2     # the same on the CPU
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench.decoder_step as ds  # noqa: E402


def kernel_caches() -> dict:
    """Compiled variants of each Triton kernel of the Philox path, all devices together (empty without Triton)."""
    from components.directions import philox

    sizes = {}
    for name in dir(philox):
        jit = getattr(philox, name)
        caches = getattr(jit, "device_caches", None)
        if caches is not None:
            sizes[name] = sum(len(entry[0]) for entry in caches.values())
    return sizes


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--shape", default="w128-l2", choices=ds.SHAPES)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--dtype", default=None, choices=["fp32", "bf16"], help="default fp32 on cpu, bf16 on cuda")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=1, help="profiled steps")
    parser.add_argument("--rows", type=int, default=25, help="rows of the profiler's table")
    parser.add_argument("--trace", default=None, help="a folder for the Chrome trace")
    args = parser.parse_args(argv)
    args.dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    args.shapes = [args.shape]

    import torch
    from torch.profiler import ProfilerActivity, profile

    import bench.step_cost as sc

    sc.DEVICE = device = torch.device(args.device)
    model, params, x, y = ds.build(args)
    step = ds.make_step("regenerate", model, params, x, y, args.batch)
    for _ in range(args.warmup):
        step()
    sc.synchronize()
    start = time.perf_counter()
    step()
    sc.synchronize()
    plain_ms = (time.perf_counter() - start) * 1000

    cuda = device.type == "cuda"
    compiled_before = kernel_caches()
    allocs_before = torch.cuda.memory_stats() if cuda else {}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    times = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            with profile(activities=activities, record_shapes=False) as prof:
                for _ in range(args.steps):
                    start = time.perf_counter()
                    step()
                    sc.synchronize()
                    times.append((time.perf_counter() - start) * 1000)
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode(0)
    compiled_after = kernel_caches()
    allocs_after = torch.cuda.memory_stats() if cuda else {}
    launches = collections.Counter()
    for event in prof.events():
        if cuda and event.device_type == torch.autograd.DeviceType.CUDA:
            launches[event.name] += 1
    record = dict(
        shape=args.shape, device=torch.cuda.get_device_name() if cuda else f"cpu ({torch.get_num_threads()} threads)",
        dtype=args.dtype, batch=args.batch, length=args.length, params=sum(p.numel() for p in params),
        plain_step_ms=round(plain_ms, 3), step_ms=[round(t, 3) for t in times],
        triton_compiles={k: compiled_after[k] - compiled_before.get(k, 0) for k in compiled_after
                         if compiled_after[k] != compiled_before.get(k, 0)},
        triton_variants=compiled_after,
        host_syncs=sum("synchroniz" in str(w.message).lower() for w in caught),
        sync_sites=collections.Counter(f"{Path(w.filename).name}:{w.lineno}" for w in caught
                                       if "synchroniz" in str(w.message).lower()).most_common(10),
        allocations=(allocs_after.get("allocation.all.allocated", 0) - allocs_before.get("allocation.all.allocated", 0))
        if cuda else None,
        requested_bytes=(allocs_after.get("requested_bytes.all.allocated", 0)
                         - allocs_before.get("requested_bytes.all.allocated", 0)) if cuda else None,
        launches=dict(launches.most_common(30)), torch=torch.__version__)
    print(json.dumps(record), flush=True)
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=args.rows))
    if cuda:
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
    if args.trace:
        Path(args.trace).mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(Path(args.trace) / f"regenerate-{args.shape}.json"))


if __name__ == "__main__":
    main()
