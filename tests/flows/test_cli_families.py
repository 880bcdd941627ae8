"""`privzo run` and `privzo sweep` on each algorithm family, run as a user types them: the standard loop (a
classifier), the nonsmooth family (O2NC on the synthetic w_linear objective) and the KL family (KL-Spider on a
synthetic PL problem). Each reports in its own metrics: test accuracy for a classifier; excess risk with the
Goldstein certificate (O2NC) or the gradient norm (KL) for an objective, which has no accuracy."""
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import EXAMPLES

# imported here, outside any test's output capture: Prefect binds its log handlers to the streams it finds
# when first imported, and a capsys stream is closed after its test (the in-process refusal below)
import flows.private_train  # noqa: E402,F401
import flows.sweep  # noqa: E402,F401

PRIVZO = [sys.executable, "-m", "flows.cli"]
ROOT = Path(__file__).resolve().parents[2]
NUMBER = r"(-?[0-9.]+(?:e[-+]?[0-9]+)?|nan)"


def _privzo(args, cwd, api_url, timeout=240):
    """The command a user types, in its own process; it uses the module's Prefect server rather than starting
    a temporary one of its own (seconds per command)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PRIVZO_LEDGER_URL=f"sqlite:///{cwd / 'ledger.db'}",
               PREFECT_API_URL=api_url)
    return subprocess.run(PRIVZO + args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def _small(tmp_path, mlflow_db, data: dict) -> Path:
    """The spec in tmp_path, its MLflow store and checkpoints there too."""
    data["tracking"] = {**data.get("tracking", {}), "uri": mlflow_db}
    data["checkpoint"] = {"dir": str(tmp_path / "checkpoints")}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _standard(tmp_path, mlflow_db, tiny_spec_dict):
    tiny_spec_dict["optimizer"]["steps"] = 40
    return _small(tmp_path, mlflow_db, tiny_spec_dict), 2.0


def _nonsmooth(tmp_path, mlflow_db, _tiny):
    # the shipped P1 example with 500 rows in R^2: the theory preset plans 200 steps (4,968 for the example's)
    data = yaml.safe_load((EXAMPLES / "p1_o2nc_001.yaml").read_text())
    data["data"]["source"].update(rows=500, dimension=2)
    return _small(tmp_path, mlflow_db, data), 1.0


def _kl(tmp_path, mlflow_db, _tiny):
    # the shipped Q1 example with 300 rows in R^4; at so few rows the preset's noise floor is below the initial
    # gap only from epsilon ~3 (the example's 4 is kept)
    data = yaml.safe_load((EXAMPLES / "q1_kl_spider.yaml").read_text())
    data["data"]["source"].update(rows=300, dimension=4)
    return _small(tmp_path, mlflow_db, data), 4.0


SUMMARY = {
    "standard": rf"^tiny-digits: test accuracy {NUMBER}, test loss {NUMBER}$",
    "nonsmooth": rf"^p1-o2nc-001: excess risk {NUMBER}, Goldstein certificate {NUMBER}, test loss {NUMBER}$",
    "kl": rf"^q1-kl-spider: excess risk {NUMBER}, gradient norm {NUMBER}$",
}
SPECS = {"standard": _standard, "nonsmooth": _nonsmooth, "kl": _kl}
NAMES = {"standard": "tiny-digits", "nonsmooth": "p1-o2nc-001", "kl": "q1-kl-spider"}
# the sweep's metric columns (CSV) and the headings of its markdown tables (none for classifiers only)
COLUMNS = {"standard": ["accuracy"], "nonsmooth": ["excess_risk", "goldstein_certificate"],
           "kl": ["excess_risk", "grad_norm"]}
HEADINGS = {"standard": [], "nonsmooth": ["**excess risk** (lower is better)",
                                          "**Goldstein certificate** (lower is better)"],
            "kl": ["**excess risk** (lower is better)", "**gradient norm** (lower is better)"]}


@pytest.mark.e2e
@pytest.mark.parametrize("family", ["standard", "nonsmooth", "kl"])
def test_run_prints_the_familys_summary_line(prefect_server, tmp_path, mlflow_db, tiny_spec_dict, family):
    path, _eps = SPECS[family](tmp_path, mlflow_db, tiny_spec_dict)
    import specs

    specs.load_spec(path)  # the shrunk example is still a valid spec (what `privzo validate` checks first)
    out = _privzo(["run", "--no-progress", str(path)], tmp_path, prefect_server)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    # the model at its initial weights first (what MLflow holds at step 0), then the trained one
    assert lines[0].startswith(f"{NAMES[family]} before training: "), out.stdout
    match = re.match(SUMMARY[family], lines[1])
    assert match, out.stdout
    values = [float(v) for v in match.groups()]
    assert all(math.isfinite(v) for v in values), lines[1]
    if family == "standard":
        assert 0.0 <= values[0] <= 1.0
    else:
        assert "accuracy" not in out.stdout
        assert values[0] >= 0.0  # an excess risk
    assert lines[2].startswith("privacy: (") and any(line.startswith("MLflow run ") for line in lines), out.stdout


@pytest.mark.e2e
@pytest.mark.parametrize("family", ["standard", "nonsmooth", "kl"])
def test_sweep_tables_the_familys_metrics(prefect_server, tmp_path, mlflow_db, tiny_spec_dict, family):
    path, eps = SPECS[family](tmp_path, mlflow_db, tiny_spec_dict)
    table = tmp_path / "results" / "table.md"
    out = _privzo(["sweep", str(path), "--epsilons", f"{eps:g}", "--seeds", "0", "--tracking-uri", mlflow_db,
                   "--out", str(table)], tmp_path, prefect_server)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    printed = table.read_text()
    assert printed in out.stdout
    lines = printed.splitlines()
    assert [line for line in lines if line.startswith("**")] == HEADINGS[family]
    # every metric but O2NC's certificate (exact at the end only) is logged at step 0 too, beside the final one
    at_start = [m for m in COLUMNS[family] if m != "goldstein_certificate"]
    heads = [line for line in lines if line.startswith("| spec |")]
    assert heads == [f"| spec | {'at step 0 | ' if m in at_start else ''}ε = {eps:g} | s / run |"
                     for m in COLUMNS[family]], printed
    rows = [line for line in lines if line.startswith(f"| {NAMES[family]} |")]
    assert len(rows) == len(heads), printed
    for row, m in zip(rows, COLUMNS[family]):  # one seed: a bare number, no spread
        before = rf"{NUMBER} \| " if m in at_start else ""
        assert re.fullmatch(rf"\| {NAMES[family]} \| {before}{NUMBER} \| [0-9]+ \|", row), row
    csv = table.with_suffix(".csv").read_text().splitlines()
    assert csv[0] == (f"name,estimator,epsilon,seed,{','.join(COLUMNS[family])},"
                      f"{''.join(m + '_at_step0,' for m in at_start)}spent_epsilon,seconds,private")
    assert len(csv) == 2 and csv[1].startswith(f"{NAMES[family]},")
    assert table.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


def test_sweep_tables_each_metric_for_the_specs_that_have_it():
    """A mixed sweep runs: one table per metric, each listing only the specs evaluated in it; the CSV has a
    column per metric, empty where a cell has not that metric. Classifiers alone print the one table."""
    from flows.sweep import results_csv, results_table, utility_plot

    def cell(name, seed, **metrics):
        return {"name": name, "estimator": "e", "epsilon": 1.0, "seed": seed, "spent_epsilon": 1.0, "seconds": 2.0,
                "private": True, "metrics": list(metrics), **metrics}

    cells = [cell("digits", s, accuracy=0.9 + s / 100) for s in (0, 1)]
    cells += [cell("p1", s, excess_risk=0.25, goldstein_certificate=0.5) for s in (0, 1)]
    cells += [cell("q5", 0, grad_norm=0.125)]
    table = results_table(cells, [1.0])
    assert table == (
        "**test accuracy (%)** (higher is better)\n\n| spec | ε = 1 | s / run |\n|---|---|---|\n"
        "| digits | 90.5 ± 0.7 | 2 |\n\n"
        "**excess risk** (lower is better)\n\n| spec | ε = 1 | s / run |\n|---|---|---|\n| p1 | 0.25 ± 0 | 2 |\n\n"
        "**Goldstein certificate** (lower is better)\n\n| spec | ε = 1 | s / run |\n|---|---|---|\n"
        "| p1 | 0.5 ± 0 | 2 |\n\n"
        "**gradient norm** (lower is better)\n\n| spec | ε = 1 | s / run |\n|---|---|---|\n| q5 | 0.125 | 2 |\n")
    csv = results_csv(cells).splitlines()
    assert csv[0] == "name,estimator,epsilon,seed,accuracy,excess_risk,goldstein_certificate,grad_norm," \
                     "spent_epsilon,seconds,private"
    assert csv[1] == "digits,e,1.0,0,0.900000,,,,1,2.0,true" and csv[3] == "p1,e,1.0,0,,0.25,0.5,,1,2.0,true"
    assert utility_plot(cells, [1.0])[:4] == b"\x89PNG"
    assert results_table(cells[:2], [1.0]).startswith("| spec | ε = 1 | s / run |\n")  # classifiers: no heading


def test_sweep_refuses_a_cell_its_data_cannot_carry_before_anything_starts(tmp_path, monkeypatch, capsys):
    """A KL preset whose noise floor at a small epsilon is above the initial gap: refused in one line naming
    the spec and the epsilon, before Prefect or MLflow start (no cell runs first)."""
    from flows import cli

    monkeypatch.chdir(tmp_path)
    code = cli.main(["sweep", str(EXAMPLES / "q1_kl_spider.yaml"), "--epsilons", "0.1", "4", "--seeds", "0",
                     "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("privzo: error: sweep: q1-kl-spider cannot run at epsilon 0.1: data: n = 4000 rows "
                               "are too few for kl_spider's preset"), err
    assert list(tmp_path.iterdir()) == []
