"""bench/ scripts stay runnable (their numbers are read by people, not asserted here)."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_step_cost_runs_on_the_mlp():
    out = subprocess.run(
        [sys.executable, "bench/step_cost.py", "--models", "mlp", "--mlp-steps", "2", "--estimators", "two_point", "pazo_s",
         "first_order"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith("mlp")]
    peer = [r for r in rows if r[1] == "mezo-peer"]
    cells = [r for r in rows if r[1] != "mezo-peer"]
    assert len(peer) == 1 and float(peer[0][3]) > 0
    # two_point: cache, regenerate, prefetch; pazo_s has no seeded directions to prefetch; first_order
    # (DP-SGD) has no directions at all: one cell against a batched forward/backward
    assert [(r[1], r[2]) for r in cells] == [("two_point", "cache"), ("two_point", "regenerate"),
                                             ("two_point", "prefetch"), ("pazo_s", "cache"), ("pazo_s", "regenerate"),
                                             ("first_order", "backprop")]
    assert all(float(r[6]) > 0 for r in cells)  # ratio column


def test_memory_runs_the_first_order_methods_on_the_mlp():
    """Each method in its own process: per-example gradients (DP-SGD, GEP) hold 64 rows x 1.2 MB at once,
    which PAZO-M, a zeroth-order step with one public backward pass, never does."""
    out = subprocess.run([sys.executable, "bench/memory.py", "--model", "mlp", "--methods", "pazo_m", "dp_sgd", "gep"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    rows = {r[0]: r for r in (line.split() for line in out.stdout.splitlines()) if r[0] in
            ("inference", "pazo_m", "dp_sgd", "gep")}
    assert list(rows) == ["inference", "pazo_m", "dp_sgd", "gep"]
    assert [rows[m][1:3] for m in rows] == [["64", "0"], ["64", "64"], ["64", "0"], ["64", "64"]]  # batch, public
    extra = {m: float(r[4]) for m, r in rows.items()}  # MiB over inference
    assert extra["dp_sgd"] > extra["pazo_m"] + 32 and extra["gep"] > 32
    assert rows["dp_sgd"][7] == "1.000"  # its extra against itself


def test_memory_measures_the_planner_on_a_small_decoder():
    """Each case in its own process, its peak of torch's CPU allocations next to components/memory_plan.py's estimate:
    within 15% on a tiny decoder too, where activations weigh as much as the weights."""
    out = subprocess.run([sys.executable, "bench/memory.py", "--model", "decoder", "--quick", "--precisions", "fp32",
                          "--cases", "inference", "regenerate", "dp_sgd"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    cases = ("inference", "regenerate", "cache", "dp_sgd")
    rows = {r[0]: r for r in (line.split() for line in out.stdout.splitlines()) if r and r[0] in cases}
    assert list(rows) == ["inference", "regenerate", "dp_sgd"]
    assert all(0.85 <= float(r[4]) <= 1.15 for r in rows.values()), out.stdout  # planned / measured
    assert float(rows["dp_sgd"][2]) > float(rows["regenerate"][2]) > float(rows["inference"][2])


def test_memory_halves_a_batch_whose_estimate_is_over_the_budget():
    from bench.memory import batch_that_fits, estimated_extra

    d, chunk = 91 * 2**20, 256 * 2**20  # MiniLM's 22.7M float32 parameters, clipped_sums.py's chunk
    assert estimated_extra("gep", d, 32, chunk) > 32 * d  # more than the 32 anchors' gradients
    assert batch_that_fits("gep", d, 32, chunk, base=2**29, budget=2**40) == 32
    # 32 anchor rows and the 16-row basis (48 d, 4.3 GB) do not fit 3 GiB; 16 rows and 16 (2.9 GB) neither
    assert batch_that_fits("gep", d, 32, chunk, base=2**29, budget=3 * 2**30) == 8
    assert batch_that_fits("dpzero", d, 32, chunk, base=2**29, budget=2**30) == 32  # zeroth order: no guard


@pytest.mark.e2e
def test_ray_step_runs_on_the_transformer():
    """Starts Ray with 2 MiniLM workers: one timed step each way, the smallest cell."""
    out = subprocess.run(
        [sys.executable, "bench/ray_step.py", "--steps", "1", "--warmup", "0", "--queries", "1", "--trainable", "head"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    (row,) = [line.split() for line in out.stdout.splitlines() if line.startswith("head")]
    assert row[1] == "8085" and float(row[5]) > 0  # trainable dimension, ray/local ratio
    assert row[-2:] == ["[1,", "1]"]  # one torch thread per worker


def test_step_parts_runs_on_the_mlp():
    out = subprocess.run([sys.executable, "bench/step_parts.py", "--models", "mlp", "--repeats", "2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    (row,) = [line.split() for line in out.stdout.splitlines() if line.startswith("mlp")]
    assert row[1] == "301066" and all(float(v) > 0 for v in row[3:])


def test_fuzz_specs_runs_a_few_cases():
    """The spec fuzzer's tiny mode: a few cases from each generator, none a traceback (10,000 by default)."""
    out = subprocess.run([sys.executable, "bench/fuzz_specs.py", "--cases", "60", "--cli-every", "5"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stdout + out.stderr
    (total,) = [line.split() for line in out.stdout.splitlines() if line.startswith("total")]
    assert total[1:] == ["60", str(int(total[2])), str(60 - int(total[2])), "0"]  # cases, valid, rejected, tracebacks
    cli = next(line for line in out.stdout.splitlines() if line.startswith("privzo validate on "))
    assert int(cli.split()[3]) >= 6, cli  # every 5th case, less trees too deep to write as YAML


def test_secure_noise_runs_its_smallest_cells():
    """Secure over fast noise: one q-scalar and one d-dimensional estimator, the shortest settings."""
    out = subprocess.run([sys.executable, "bench/secure_noise.py", "--estimators", "two_point", "dpgd_0th", "--steps",
                          "2", "--dense-steps", "1", "--parts-repeats", "3", "--sizes", "--dims", "100"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "two_point" in out.stdout and "dpgd_0th" in out.stdout


def test_run_cost_extrapolates_a_cell_from_a_few_steps():
    sys.path.insert(0, str(ROOT))
    from bench.run_cost import cost

    c = cost(str(ROOT / "specs" / "examples" / "digits_dope_sgd.yaml"), steps=3, epsilon=2.0)
    assert c["planned_steps"] > 3 and c["warm_start_s"] > 0 and c["step_s"] > 0
    parts = c["load_s"] + c["warm_start_s"] + c["evaluation_s"] + c["step_s"] * c["planned_steps"]
    assert c["cell_s"] == pytest.approx(parts)


def test_ledger_scale_times_reserve_and_commit_on_a_few_nights(tmp_path):
    sys.path.insert(0, str(ROOT))
    from bench.ledger_scale import main

    out = tmp_path / "scale.json"
    assert main(["--runs", "1", "3", "--accountants", "rdp", "--window", "2", "--out", str(out)]) == 0
    import json

    rows = json.loads(out.read_text())
    assert [(r["accountant"], r["layout"]) for r in rows] == [("rdp", "one block"), ("rdp", "daily blocks")]
    assert all(set(r["ms"]) == {"1", "3"} and r["run_epsilon"] <= 2.0 for r in rows)


def test_decoder_step_times_its_cases_on_the_smallest_decoder():
    out = subprocess.run([sys.executable, "bench/decoder_step.py", "--shapes", "w128-l2", "--cases", "inference",
                          "regenerate", "mezo", "--steps", "1", "--warmup", "0", "--no-peak"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    row = next(line for line in out.stdout.splitlines() if line.startswith("| w128-l2 |"))
    assert "failed" not in row and row.count("(×") == 2, row  # regenerate and mezo, each over the floor


@pytest.mark.e2e
def test_ledger_load_admits_what_fits_on_postgres(tmp_path):
    out = subprocess.run([sys.executable, "bench/ledger_load.py", "--runs", "3", "--burst", "6", "--burst-procs", "2",
                          "--out", str(tmp_path / "load.json")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    if out.returncode == 2 and "PostgreSQL did not start" in out.stderr:
        pytest.skip(out.stderr.strip())
    assert out.returncode == 0 and out.stdout.rstrip().endswith("all checks hold"), out.stdout[-2000:] + out.stderr[-2000:]
    import json

    rows = json.loads((tmp_path / "load.json").read_text())
    assert [(r["load"], r["reservations"]) for r in rows] == [("runs at once", 3), ("burst", 6)]
    assert all(r["admitted"] >= 1 and not r["crashes"] for r in rows)
