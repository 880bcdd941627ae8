"""A night of the shipped nightly (specs/examples/digits_stream.yaml) on the local backend against the same
nights on Ray workers, measured in one run: each night's wall time, the ratio, and where the time goes (the
flow's Prefect task runs; the rest of the flow run is the training itself, the Ray workers' start included).

Both sides play the same nights on scratch ledgers and MLflow stores of their own (``flows.simulate``), so they
read the same rows and charge the same blocks. Ray is started before the clock, as a team's cluster is running.

    .venv/bin/python bench/night.py [--nights 3] [--workers 2]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def _task_seconds(since: float) -> dict:
    """Seconds per task name, summed over the flow runs started after ``since`` (the temporary server's)."""
    import datetime as dt

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter

    async def read():
        async with get_client() as client:
            after = dt.datetime.fromtimestamp(since, dt.timezone.utc)
            runs = await client.read_flow_runs()
            totals = defaultdict(float)
            for run in (r for r in runs if r.start_time is not None and r.start_time >= after):
                totals["flow run"] += run.total_run_time.total_seconds()
                for task in await client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [run.id]})):
                    totals[task.name.rsplit("-", 1)[0]] += task.total_run_time.total_seconds()
            return dict(totals)

    return asyncio.run(read())


def _play(spec: dict, nights: int, folder: Path) -> tuple:
    from flows.simulate import simulate

    folder.mkdir(parents=True)
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    start = time.time()
    played = simulate(str(path), nights, folder=folder)
    wall = time.time() - start
    assert all(n.status == "committed" for n in played["nights"]), played["nights"]
    return wall / nights, _task_seconds(start), played


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nights", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

    from components.runtime.ray_backend import connect

    spec = yaml.safe_load((ROOT / "specs" / "examples" / "digits_stream.yaml").read_text())
    scratch = Path(tempfile.mkdtemp(prefix="privzo-bench-night-"))
    _task_seconds(time.time())  # Prefect's temporary server started before the clock, as a team's is running
    local = _play({**spec, "execution": {"backend": "local"}}, args.nights, scratch / "local")
    connect("local", args.workers)  # started before the clock: a team's Ray is already running
    on_ray = _play({**spec, "execution": {"backend": "ray", "workers": args.workers}}, args.nights, scratch / "ray")
    same = [(b.block, b.charges, b.epsilon) for b in local[2]["blocks"]] == \
        [(b.block, b.charges, b.epsilon) for b in on_ray[2]["blocks"]]
    print(f"{args.nights} nights of {spec['name']} ({os.cpu_count()} CPUs); block tables equal: {same}")
    print(f"| | local | ray ({args.workers} workers) |\n|---|---:|---:|")
    print(f"| wall a night (s) | {local[0]:.1f} | {on_ray[0]:.1f} |")
    for name in sorted(set(local[1]) | set(on_ray[1]), key=lambda n: (n != "flow run", n)):
        print(f"| {name} a night (s) | {local[1].get(name, 0) / args.nights:.2f} | "
              f"{on_ray[1].get(name, 0) / args.nights:.2f} |")
    print(f"ray / local wall: {on_ray[0] / local[0]:.2f}x")


if __name__ == "__main__":
    main()
