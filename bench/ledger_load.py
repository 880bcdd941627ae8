"""The PostgreSQL ledger under load: many runs reserving at once on overlapping windows of one dataset's
daily blocks, each its own process with its own engine, as the team's workers are.

Every run plans the nightly example's event (specs/examples/digits_retrain.yaml, as privzo plans it; RDP),
and each block's lifetime admits exactly CAPACITY copies of it, so the checks are exact whatever order the
runs land in:
- safe: no block holds more than CAPACITY charges (reserved or committed), none above its lifetime;
- maximal: every refused run's window holds a full block (it could not have fitted), so the number admitted
  is exactly what fits for the order they came in;
- no crash: a run either reserves or is refused with BudgetExceeded; anything else (a deadlock, a
  serialization failure surfacing) is counted and its first line printed.

Two loads: ``--runs`` runs at once (one reservation each, committed at its planned event as a run that
finished would), then a burst of ``--burst`` reservations from ``--burst-procs`` processes, each reserving
back to back. Prints admitted against capacity, the checks, and the reserve time's median and 95th
percentile per load. Needs a PostgreSQL on 127.0.0.1 (infra/postgres/test-db.sh start, as root; a scratch
schema is made and dropped).

    PYTHONPATH=. python bench/ledger_load.py [--runs 32] [--burst 200] [--burst-procs 16] [--window 7]
        [--blocks 14] [--capacity 3] [--out F]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

DATASET = "load"


def _terms(event, lifetime: float, delta: float):
    from flows.ledger import DatasetTerms

    return DatasetTerms(DATASET, lifetime, delta, "rdp", "add_remove")


def _reservation(event, lifetime: float, delta: float, start: int, window: int, name: str):
    from flows.ledger import BlockTerms, Reservation, WindowRead

    blocks = [BlockTerms(f"day-{d:03d}", lifetime, delta, 100) for d in range(start, start + window)]
    return Reservation(terms=_terms(event, lifetime, delta), planned=event, steps=0, fingerprint="0" * 64,
                       run_name=name, window=WindowRead(blocks), block_terms=False)


def _one_process(url: str, jobs, event, lifetime: float, delta: float, window: int, commit: bool, barrier, out):
    """Reserve each job's window back to back (after every process is ready); what happened to each, and how
    long its reservation took."""
    from flows.ledger import BudgetExceeded, PrivacyLedger

    ledger = PrivacyLedger(url)
    ledger.history(DATASET)  # the engine connected and the tables found before the clock
    barrier.wait()
    for name, start in jobs:
        started = time.perf_counter()
        try:
            charge = ledger.reserve(_reservation(event, lifetime, delta, start, window, name))
            outcome = "admitted"
        except BudgetExceeded:
            charge, outcome = None, "refused"
        except Exception as err:  # noqa: BLE001 - what the bench counts as a crash
            charge, outcome = None, f"crash: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
        took = time.perf_counter() - started
        if charge is not None and commit:
            ledger.commit(charge, event, 0, run_id=name)
        out.put({"name": name, "start": start, "outcome": outcome, "seconds": took})
    ledger.engine.dispose()


def load(url: str, jobs_by_process, event, lifetime, delta, window, commit) -> list:
    context = mp.get_context("spawn")  # each its own interpreter and engine, as separate runs are
    barrier, out = context.Barrier(len(jobs_by_process)), context.Queue()
    procs = [context.Process(target=_one_process, args=(url, jobs, event, lifetime, delta, window, commit, barrier, out))
             for jobs in jobs_by_process]
    for p in procs:
        p.start()
    total = sum(len(j) for j in jobs_by_process)
    results = [out.get(timeout=600) for _ in range(total)]
    for p in procs:
        p.join(timeout=60)
    return results


def verdict(url: str, results: list, window: int, capacity: int, lifetime: float) -> dict:
    from flows.ledger import PrivacyLedger

    blocks = {b.block: b for b in PrivacyLedger(url).blocks(DATASET)}
    full = {name for name, b in blocks.items() if b.charges >= capacity}
    refused = [r for r in results if r["outcome"] == "refused"]
    times = sorted(r["seconds"] for r in results)
    return {
        "reservations": len(results),
        "admitted": sum(r["outcome"] == "admitted" for r in results),
        "refused": len(refused),
        "crashes": [r["outcome"] for r in results if r["outcome"].startswith("crash")],
        "most_charges_on_a_block": max((b.charges for b in blocks.values()), default=0),
        "capacity": capacity,
        "largest_block_epsilon": max((b.epsilon for b in blocks.values()), default=0.0),
        "lifetime": lifetime,
        "refused_without_a_full_block": sum(
            not any(f"day-{d:03d}" in full for d in range(r["start"], r["start"] + window)) for r in refused),
        "p50_ms": round(1000 * statistics.median(times), 1),
        "p95_ms": round(1000 * times[min(len(times) - 1, int(0.95 * len(times)))], 1),
    }


def _schema(base: str) -> tuple:
    import sqlalchemy as sa

    schema = f"load{uuid.uuid4().hex[:10]}"
    engine = sa.create_engine(base)
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE SCHEMA {schema}"))
    return engine, schema, f"{base}?options=-csearch_path%3D{schema}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=32)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--burst-procs", type=int, default=16)
    parser.add_argument("--window", type=int, default=7)
    parser.add_argument("--blocks", type=int, default=14, help="days the windows start on: 0 .. blocks - window")
    parser.add_argument("--capacity", type=int, default=3, help="copies of the run's event a block's lifetime admits")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    import sqlalchemy as sa
    from dp_accounting.rdp import RdpAccountant

    from ledger_scale import example_event

    started = subprocess.run(["bash", str(ROOT / "infra" / "postgres" / "test-db.sh"), "start"], capture_output=True,
                             text=True, timeout=600)
    if started.returncode != 0:
        print(f"ledger_load: PostgreSQL did not start: {started.stderr.strip()[-300:]}", file=sys.stderr)
        return 2
    base = started.stdout.strip().splitlines()[-1]
    event, delta, _ = example_event("rdp")
    # between CAPACITY and CAPACITY + 1 copies: exactly CAPACITY fit on a block
    fits = [RdpAccountant().compose(event, k).get_epsilon(delta) for k in (args.capacity, args.capacity + 1)]
    lifetime = sum(fits) / 2
    starts = args.blocks - args.window + 1
    rows = []
    for name, count, procs, commit in (("runs at once", args.runs, args.runs, True),
                                       ("burst", args.burst, args.burst_procs, False)):
        engine, schema, url = _schema(base)
        try:
            jobs = [(f"{name.split()[0]}-{i}", i % starts) for i in range(count)]
            by_process = [jobs[p::procs] for p in range(procs)]
            began = time.perf_counter()
            results = load(url, by_process, event, lifetime, delta, args.window, commit)
            row = {"load": name, "processes": procs, "wall_s": round(time.perf_counter() - began, 1),
                   **verdict(url, results, args.window, args.capacity, lifetime)}
        finally:
            with engine.begin() as conn:
                conn.execute(sa.text(f"DROP SCHEMA {schema} CASCADE"))
            engine.dispose()
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| load | processes | reservations | admitted | refused | crashes | most charges on a block (capacity) "
          "| refused with room | reserve p50 (ms) | p95 (ms) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['load']} | {r['processes']} | {r['reservations']} | {r['admitted']} | {r['refused']} | "
              f"{len(r['crashes'])} | {r['most_charges_on_a_block']} ({r['capacity']}) | "
              f"{r['refused_without_a_full_block']} | {r['p50_ms']} | {r['p95_ms']} |")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))
    ok = all(not r["crashes"] and r["most_charges_on_a_block"] <= r["capacity"] and
             r["largest_block_epsilon"] <= r["lifetime"] and r["refused_without_a_full_block"] == 0 for r in rows)
    print("all checks hold" if ok else "A CHECK FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
