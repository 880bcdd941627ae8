"""Bytes moved between the driver and Ray workers per private step, and step time ray vs local.

Every message the Ray backend sends or receives (query arguments, clipped sums, updates, checksums) is
serialised with pickle protocol 5, as Ray does for plain Python values, and its length counted. The
row indices of the batch are reported apart: they are the one part that grows with the batch.

    python bench/ray_bytes.py [--steps 20]                  # Ray started here, 2 local workers
    python bench/ray_bytes.py --cluster                     # a head + 2 worker nodes + a driver host
    python bench/ray_bytes.py --address ray://HEAD:10001    # a cluster already up

With ``--cluster`` the benchmark starts infra/ray/cluster.py's cluster (separate hosts on this machine),
runs itself on the driver host against it, and stops it. Every process then shares this machine's cores:
the time ratio is the cluster's overhead per step (network hops, serialisation), not a speed-up.
Step time on the transformer (MiniLM), Ray against local: bench/ray_step.py.
"""
from __future__ import annotations

import argparse
import copy
import os
import pickle
import statistics
import time

import numpy as np
import ray
import torch

import specs
from components import builders
from components.runtime import ray_backend

TINY = {
    "name": "bench-ray", "seed": 0,
    "data": {"source": {"kind": "sklearn", "name": "digits"},
             "split": {"kind": "fraction", "public": 0.04, "test": 0.2, "imbalance": [1.0, 0.85]},
             "declared_private_rows": 1384},
    "model": {"kind": "mlp", "hidden": [128]},
    "mechanism": {"kind": "gaussian", "clip": 1.0},
    "privacy": {"epsilon": 2.0}, "sampling": {"kind": "poisson", "expected_batch_size": 64},
    "optimizer": {"kind": "sgd", "lr": 0.05, "steps": 10_000},
}


class Meter:
    def __init__(self):
        self.payload = 0
        self.indices = 0

    def count(self, *values):
        for v in values:
            if isinstance(v, np.ndarray) and v.dtype.kind in "iu":
                self.indices += len(pickle.dumps(v, protocol=5))
            else:
                self.payload += len(pickle.dumps(v, protocol=5))


def instrument(backend: ray_backend.RayBackend, meter: Meter) -> None:
    """Wrap the backend's remote calls to count exactly the messages that cross the process boundary."""
    original_query, original_apply = backend.query, backend.apply

    def query(q, indices, clip):
        idx = indices.cpu().numpy().astype(np.int32)
        jobs, how = backend._split(q, idx)
        out = original_query(q, indices, clip)
        for _w, sub, part in jobs:
            encoded, *rest = backend.message(sub, part, clip)
            meter.count(encoded, *[r for r in rest if not isinstance(r, np.ndarray)], part)
            meter.count([0.0] * (sub.size if how == "concat" else out.shape[0]))  # the clipped sums back
        return out

    def apply(update):
        message = ray_backend.encode_update(update)
        for _ in backend.workers:
            meter.count(message, 0.0)  # the update out, the checksum back
        return original_apply(update)

    backend.query, backend.apply = query, apply


def run(spec_dict, steps: int):
    spec = specs.spec_from_dict(spec_dict)
    data = builders.load_data(spec)
    resolved, _, _ = builders.resolve_privacy(spec, len(data.private))
    built = builders.build_loop(resolved, data)
    meter = Meter()
    if spec.execution.backend == "ray":
        instrument(built.loop.backend, meter)
    built.loop.run(2)
    meter.payload = meter.indices = 0
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        built.loop.run(built.loop.step + 1)
        times.append(time.perf_counter() - start)
    close = getattr(built.loop.backend, "close", None)
    if close:
        close()
    return meter, statistics.median(times) * 1000


def on_cluster(steps: int) -> int:
    """Start a test cluster, run this benchmark on its driver host against it, stop it."""
    import importlib.util
    import sys
    import tempfile
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("privzo_ray_cluster", root / "infra" / "ray" / "cluster.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cluster = module.LocalCluster(Path(tempfile.mkdtemp(prefix="privzo-bench-cluster-")), workers=2).up()
    try:
        print(f"# cluster ({cluster.mode}): head {cluster.gcs_address} (no CPU offered), 2 worker nodes of 2 CPUs, "
              f"driver on {cluster.driver_ip}; every host shares this machine's {os.cpu_count()} cores", flush=True)
        return cluster.run_on_driver([sys.executable, str(Path(__file__).resolve()), "--address", cluster.client_address,
                                      "--steps", str(steps)], cwd=root, env={"PYTHONPATH": str(root)}).returncode
    finally:
        cluster.down()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--address", default="local", help="execution.address of the Ray rows (default: start Ray here)")
    parser.add_argument("--cluster", action="store_true", help="start a head + 2 worker nodes + a driver host here")
    args = parser.parse_args(argv)
    if args.cluster:
        raise SystemExit(on_cluster(args.steps))
    if args.address == "local":
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    print(f"# bytes per step between driver and 2 workers (pickle protocol 5, payloads only, not Ray's own "
          f"task headers), digits MLP, {args.steps} steps; Ray at {args.address}, local in this process")
    print(f"{'estimator':10} {'q':>3} {'mode':10} {'payload B/step':>15} {'indices B/step':>15} {'ray ms':>8} {'local ms':>9} {'ratio':>6}")
    for kind, q in (("two_point", 1), ("two_point", 4), ("two_point", 8), ("pazo_m", 1), ("pazo_p", 2)):
        for mode in ("data", "directions"):
            d = copy.deepcopy(TINY)
            est = {"kind": kind, "queries": q}
            if kind == "pazo_m":
                est["public_batch_size"] = 16
            if kind == "pazo_p":
                est.update(public_batches=3, public_batch_size=16)
            d["estimator"] = est
            local_d = copy.deepcopy(d)
            d["execution"] = {"backend": "ray", "workers": 2, "parallelism": mode, "address": args.address}
            meter, ray_ms = run(d, args.steps)
            _, local_ms = run(local_d, args.steps)
            print(f"{kind:10} {q:>3} {mode:10} {meter.payload / args.steps:15.0f} {meter.indices / args.steps:15.0f} "
                  f"{ray_ms:8.2f} {local_ms:9.2f} {ray_ms / local_ms:6.1f}", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
