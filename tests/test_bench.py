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
