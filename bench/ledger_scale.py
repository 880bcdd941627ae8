"""How a reservation's cost grows with the history it composes onto: reserve + commit of the nightly example's
run event (specs/examples/digits_retrain.yaml, planned as privzo plans it) on a scratch ledger, timed at
chosen run numbers, for each accountant and two layouts:

- one block: every run charges the same block (a dataset charged as one, as before blocks);
- daily blocks: run n charges the last W blocks (a window of W days), so the dataset's history grows
  while each block holds at most W charges.

Each block keeps its committed charges' composition as a stored accountant state, so a reservation composes
one event onto it instead of the whole history. The lifetime is set high enough that no run is refused: this
measures the cost, not the budget.

    PYTHONPATH=. python bench/ledger_scale.py [--runs 1 60 365] [--accountants rdp pld] [--window 7]
        [--layouts "one block" "daily blocks"] [--out F]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def example_event(accountant: str):
    """The nightly example's planned event (its spec's sampling, steps and calibrated sigma) under ``accountant``."""
    import specs
    from components import builders

    root = Path(__file__).resolve().parents[1]
    data = specs.load_spec(root / "specs" / "examples" / "digits_retrain.yaml").model_dump(mode="json")
    data["privacy"]["accountant"] = accountant
    spec = specs.spec_from_dict(data)
    resolved, _, epsilon = builders.resolve_privacy(spec, data["data"].get("declared_private_rows"))
    event = builders.planned_event(resolved, data["data"].get("declared_private_rows"),
                                   float(resolved.mechanism.noise_multiplier))
    return event, float(resolved.privacy.delta), epsilon


def play(accountant: str, layout: str, marks, window: int, folder: Path) -> dict:
    from flows.ledger import BlockTerms, PrivacyLedger, Reservation, DatasetTerms, WindowRead

    event, delta, epsilon = example_event(accountant)
    ledger = PrivacyLedger(f"sqlite:///{folder / f'{accountant}-{layout}.db'}")
    times = {}
    for n in range(1, max(marks) + 1):
        blocks = None if layout == "one block" else [
            BlockTerms(f"day-{day:04d}", 1e6, delta, 200) for day in range(max(0, n - window), n)]
        started = time.perf_counter()
        charge = ledger.reserve(Reservation(
            terms=DatasetTerms("scale", 1e6, delta, accountant, "add_remove"), planned=event, steps=0,
            fingerprint="0" * 64, run_name=f"night-{n}", window=WindowRead(blocks), block_terms=False))
        ledger.commit(charge, event, 0, run_id=f"run-{n}")
        took = time.perf_counter() - started
        if n in marks:
            times[n] = took
            print(f"  {accountant} {layout}: run {n}: reserve + commit {took * 1000:.0f} ms", flush=True)
    return {"accountant": accountant, "layout": layout, "run_epsilon": epsilon, "delta": delta,
            "ms": {str(n): round(t * 1000, 1) for n, t in times.items()}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[1, 60, 365])
    parser.add_argument("--accountants", nargs="+", default=["rdp", "pld"])
    parser.add_argument("--window", type=int, default=7)
    parser.add_argument("--layouts", nargs="+", default=["one block", "daily blocks"],
                        choices=["one block", "daily blocks"])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for accountant in args.accountants:
            for layout in args.layouts:
                rows.append(play(accountant, layout, sorted(set(args.runs)), args.window, Path(folder)))
    marks = [str(n) for n in sorted(set(args.runs))]
    print(f"\n| accountant | layout | {' | '.join(f'run {n} (ms)' for n in marks)} | last / first |")
    print(f"|---|---|{'---|' * len(marks)}---|")
    for r in rows:
        ratio = r["ms"][marks[-1]] / r["ms"][marks[0]]
        print(f"| {r['accountant']} | {r['layout']} | {' | '.join(str(r['ms'][n]) for n in marks)} | {ratio:.2f} |")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
