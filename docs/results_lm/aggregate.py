"""One accuracy table (mean ± std over seeds, privzo sweep's own format) from the CSVs of several
``privzo sweep --out`` runs, or from the child runs a sweep logged in an MLflow store (a sweep stopped before
its end writes no CSV, but each finished cell is a child run), and the cells as one CSV.

    .venv/bin/python docs/results_lm/aggregate.py /tmp/lmres/sweep_seed*.csv sqlite:////tmp/lmres/mlflow_s0.db
"""
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from flows.sweep import results_csv, results_table  # noqa: E402
from flows.record.tracking_names import PRIVZO_ESTIMATOR


def child_runs(uri: str) -> list:
    """The finished cells a sweep logged as child runs (run name NAME-epsEPS-sSEED)."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    cells = []
    for experiment in client.search_experiments():
        # a cell's child run exists from its start (holding its step-0 evaluation): finished ones only
        runs = client.search_runs([experiment.experiment_id],
                                  "tags.mlflow.parentRunId != '' and attributes.status = 'FINISHED'")
        for run in sorted(runs, key=lambda r: r.info.start_time):  # the order the sweep ran its cells
            name, eps, seed = run.info.run_name.rsplit("-", 2)
            metrics = run.data.metrics
            cells.append({"name": name, "estimator": run.data.tags.get(PRIVZO_ESTIMATOR, ""),
                          "epsilon": float(eps[3:]), "seed": int(seed[1:]), "accuracy": metrics["eval/accuracy"],
                          "metrics": ["accuracy"], "seconds": metrics.get("time/seconds"),
                          "spent_epsilon": metrics.get("privacy/epsilon", float("nan")), "private": True})
    return cells


def main() -> None:
    cells = []
    for path in sys.argv[1:]:
        if path.startswith("sqlite:"):
            cells += child_runs(path)
            continue
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                cells.append({"name": row["name"], "epsilon": float(row["epsilon"]), "seed": int(row["seed"]),
                              "accuracy": float(row["accuracy"]), "metrics": ["accuracy"],
                              "seconds": float(row["seconds"]) if row["seconds"] else None,
                              "private": row["private"] == "true"})
    epsilons = sorted({c["epsilon"] for c in cells})
    print(results_table(cells, epsilons), end="")
    if all("spent_epsilon" in c for c in cells):
        print(results_csv(cells), end="")
    for name in dict.fromkeys(c["name"] for c in cells):
        for eps in epsilons:
            seeds = sorted(c["seed"] for c in cells if c["name"] == name and c["epsilon"] == eps)
            print(f"{name} eps={eps:g}: seeds {seeds}")


if __name__ == "__main__":
    main()
