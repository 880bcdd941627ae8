"""Step time of a two_point step on MiniLM: the Ray backend with 2 CPU workers against the local backend.

The run is the chatterbot/MiniLM spec (mean pooling, linear head, sequences of 32 tokens) with every
parameter trainable by default (the 22.7M-parameter transformer of bench/step_cost.py), a fixed private
batch of 32 rows (a timing sampler: the same rows every step, nothing private is claimed), DP noise and
clipping as in a real run. Local: forward passes in this process with 2 torch threads. Ray: 2 worker
actors, 1 torch thread each (Ray sets OMP_NUM_THREADS=1 in its workers; printed below), each holding
a replica and half the batch; the driver keeps its own replica (2 threads) and applies every update.
Local and Ray steps alternate, so a change in background load hits both alike.

    python bench/ray_step.py [--steps 10] [--queries 1 4] [--trainable all bias head]
Prints one line per (trainable, q): median step ms of each backend, the ratio ray/local, the fastest
step of each (background load inflates medians), and the bytes each step moves between the driver and
the workers (payloads, as counted by bench/ray_bytes.py).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import ray
import torch

import specs
from components import builders
from ray_bytes import Meter, instrument  # bench/ is the script's directory

BATCH = 32
SPEC = {
    "name": "bench-ray-step", "seed": 0,
    "data": {"source": {"kind": "text", "name": "chatterbot", "max_length": 32, "tokenizer": "minilm"},
             "split": {"kind": "fraction", "public": 0.0, "test": 0.2}, "declared_private_rows": 1490},
    "mechanism": {"kind": "gaussian", "clip": 1.0},
    "privacy": {"epsilon": 4.0}, "sampling": {"kind": "poisson", "expected_batch_size": BATCH},
    "optimizer": {"kind": "sgd", "lr": 1e-4, "steps": 1000},
}


class FixedBatch:
    """Timing only: the first ``BATCH`` private rows every step (not a private sampler)."""

    expected_batch_size = BATCH

    def sample(self) -> torch.Tensor:
        return torch.arange(BATCH)


def build(trainable: str, queries: int, backend: str, data):
    spec = specs.spec_from_dict({**SPEC, "model": {"kind": "hf", "name": "minilm", "trainable": trainable},
                                 "estimator": {"kind": "two_point", "queries": queries},
                                 "execution": {"backend": backend, "workers": 2}})
    resolved, _, _ = builders.resolve_privacy(spec, len(data.private))
    built = builders.build_loop(resolved, data)
    built.loop.sampler = FixedBatch()
    return built


def timed_step(built) -> float:
    start = time.perf_counter()
    built.loop.run(built.loop.step + 1)
    return (time.perf_counter() - start) * 1000


def _load() -> str:
    return "/".join(f"{v:.1f}" for v in os.getloadavg())


def worker_threads(backend) -> list:
    return ray.get([w.__ray_call__.remote(lambda _self: torch.get_num_threads()) for w in backend.workers])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per backend (median reported)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--queries", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--trainable", nargs="+", default=["all", "bias"], choices=["head", "bias", "all"])
    parser.add_argument("--threads", type=int, default=2, help="torch threads of this process (local, and the Ray driver)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    data = builders.load_data(specs.spec_from_dict({**SPEC, "model": {"kind": "hf", "name": "minilm"},
                                                    "estimator": {"kind": "two_point"}}))
    print(f"# two_point step on MiniLM, batch {BATCH} x {SPEC['data']['source']['max_length']} tokens, median of "
          f"{args.steps} steps after {args.warmup} warm-up, local {args.threads} thread(s) vs ray 2 workers; torch "
          f"{torch.__version__}, {len(os.sched_getaffinity(0))} cores usable, load average {_load()}", flush=True)
    print(f"{'trainable':9} {'params':>9} {'q':>2} {'local ms':>9} {'ray ms':>8} {'ray/local':>9} {'min local':>9} "
          f"{'min ray':>8} {'payload B/step':>15} {'indices B/step':>15}  worker threads", flush=True)
    for trainable in args.trainable:
        for q in args.queries:
            local, remote = build(trainable, q, "local", data), build(trainable, q, "ray", data)
            meter = Meter()
            instrument(remote.loop.backend, meter)
            for _ in range(args.warmup):
                timed_step(local), timed_step(remote)
            meter.payload = meter.indices = 0
            local_ms, ray_ms = [], []
            for _ in range(args.steps):
                local_ms.append(timed_step(local))
                ray_ms.append(timed_step(remote))
            threads = worker_threads(remote.loop.backend)
            remote.loop.backend.close()
            lm, rm = statistics.median(local_ms), statistics.median(ray_ms)
            print(f"{trainable:9} {local.loop.backend.directions.dim:>9} {q:>2} {lm:9.1f} {rm:8.1f} {rm / lm:9.2f} "
                  f"{min(local_ms):9.1f} {min(ray_ms):8.1f} {meter.payload / args.steps:15.0f} "
                  f"{meter.indices / args.steps:15.0f}  {threads}", flush=True)
            del local, remote
    # another process on one of the 2 cores slows 2-thread local steps several-fold (its threads wait for
    # each other) and single-thread workers much less: read the ratios together with the load
    print(f"# load average at the end {_load()}")
    ray.shutdown()


if __name__ == "__main__":
    main()
