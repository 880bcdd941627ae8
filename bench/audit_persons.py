"""Person-level audits: canary persons of k rows against the person-level claim, with the person's summed rows
clipped (as privzo runs) and, as a deliberately broken run, each row clipped alone (event level's clipping,
which lets a person of k rows move a release by k clips). Prints a markdown table for docs/audit.md.

    PYTHONPATH=. .venv/bin/python bench/audit_persons.py [--seeds 3] [--canaries 1000]

The spec is docs/audit.md's audited digits run (tests/components/test_audit.py BASE) made person level: a
one-day file of visits, one patient a row, data.blocks.person with 64 declared persons; the audit reads
only its shapes and public rows."""
from __future__ import annotations

import argparse
import copy
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

import specs
from components import builders
from components.audit.run import audit
from components.data.sources import load_sklearn

BASE = {
    "name": "audit-persons", "seed": 5,
    "model": {"kind": "linear"},
    "estimator": {"kind": "two_point", "queries": 4, "smoothing": 1e-3},
    "mechanism": {"kind": "gaussian", "clip": 1.0, "noise_multiplier": 28.7},
    "privacy": {"epsilon": 1.0, "delta": 1e-5, "accountant": "rdp"},
    "sampling": {"kind": "poisson", "expected_batch_size": 32},
    "optimizer": {"kind": "sgd", "lr": 0.05, "steps": 200},
    "execution": {"backend": "local"},
    "budget": {"dataset": "visits", "lifetime_epsilon": 4.0, "window": {"blocks": 1}},
}
ESTIMATORS = {
    "DPZero": {},
    "DP-SGD": {"estimator": {"kind": "first_order"},
               "mechanism": {"kind": "gaussian", "clip": 1.0, "noise_multiplier": 20.4},
               "optimizer": {"kind": "sgd", "lr": 0.05, "steps": 100}},
}


def visits_file(folder: Path) -> Path:
    table = load_sklearn("digits")
    frame = pd.DataFrame(table.features, columns=[f"px{i}" for i in range(64)])
    frame["digit"], frame["arrived"] = table.labels, "2026-11-01"
    frame["patient"] = [f"p{i}" for i in range(len(frame))]
    path = folder / "visits.csv"
    frame.to_csv(path, index=False)
    return path


def person_spec(path: Path, changes: dict) -> specs.RunSpec:
    d = copy.deepcopy(BASE)
    d.update(copy.deepcopy(changes))
    d["data"] = {"source": {"kind": "file", "path": str(path), "label": "digit", "classes": list(range(10))},
                 "split": {"kind": "hashed", "public": 0.04, "test": 0.2},
                 "blocks": {"arrival": "arrived", "period": "day", "person": "patient", "declared_persons": 64}}
    return specs.RunSpec.model_validate(d)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--canaries", type=int, default=1000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    path = visits_file(Path(tempfile.mkdtemp(prefix="privzo-audit-persons-")))
    print("| estimator | claimed ε | rows a canary person | clipping | seed | white-box ε ≥ | separation | "
          "black-box ε ≥ | refuted | time (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, changes in ESTIMATORS.items():
        spec = person_spec(path, changes)
        data = builders.load_data(spec, every_block=True)
        for rows in (2, 8):
            for broken in (False, True):
                for seed in range(args.seeds):
                    gen = [torch.Generator().manual_seed(1000 * seed + k) for k in range(3)]
                    start = time.perf_counter()
                    r = audit(spec, data, canaries=args.canaries, inclusion_generator=gen[0], noise_generator=gen[1],
                              sampling_generator=gen[2], person_rows=rows, clip_rows_alone=broken)
                    print(f"| {name} | {r.claimed_epsilon:.3g} | {rows} | {'each row (broken)' if broken else 'person sum'} "
                          f"| {seed} | {r.white_box.epsilon_lower:.2f} | {r.white_box.separation:.2f} | "
                          f"{r.black_box.epsilon_lower:.2f} | {'**yes**' if r.exceeds_claim else 'no'} | "
                          f"{time.perf_counter() - start:.0f} |", flush=True)


if __name__ == "__main__":
    main()
