"""Runs on a test cluster's driver host (tests/cluster/test_cluster.py): builds a spec's loop on the Ray
backend with the tests' fixed private generators, runs it, and saves what the test compares.

    python -m tests.cluster.driver SPEC.json OUT.pt --steps N [--pause-at K]

With ``--pause-at K`` it runs K steps, writes OUT.pt.paused and waits for OUT.pt.go before the rest (the
test kills a node meanwhile).
"""
import argparse
import json
import time
from pathlib import Path

import torch

from tests.conftest import fixed_loop


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("spec", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--pause-at", type=int)
    args = parser.parse_args()
    built = fixed_loop(json.loads(args.spec.read_text()))
    backend = built.loop.backend
    placed = backend.worker_nodes()
    if args.pause_at is not None:
        built.loop.run(args.pause_at)
        Path(f"{args.out}.paused").write_text(json.dumps(placed))
        while not Path(f"{args.out}.go").exists():
            time.sleep(0.2)
    built.loop.run(args.steps)
    torch.save({"params": torch.cat([p.detach().flatten() for p in built.model.parameters()]),
                "epsilon": built.loop.tracker.epsilon(), "steps": built.loop.tracker.steps,
                "placed": placed, "nodes": backend.worker_nodes(), "restarts": backend.restarts}, args.out)
    backend.close()


if __name__ == "__main__":
    main()
