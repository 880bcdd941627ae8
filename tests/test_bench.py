"""bench/ scripts stay runnable (their numbers are read by people, not asserted here)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_step_cost_runs_on_the_mlp():
    out = subprocess.run(
        [sys.executable, "bench/step_cost.py", "--models", "mlp", "--steps", "2", "--estimators", "two_point", "pazo_s"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("mlp")]
    assert len(rows) == 4 and all(float(r.split()[6]) > 0 for r in rows)
