"""``privzo audit``: the flow's MLflow run (audit.* tags, report) and the command line's refusals."""
import copy
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import yaml

from flows.record.tracking_names import (
    AUDIT_ARTIFACT, AUDIT_BLACK_BOX_CORRECT, AUDIT_BLACK_BOX_EPSILON_LOWER, AUDIT_BLACK_BOX_GUESSES,
    AUDIT_CANARIES, AUDIT_CANARIES_ARTIFACT, AUDIT_CLAIMED_EPSILON, AUDIT_CONFIDENCE, AUDIT_EPSILON_LOWER,
    AUDIT_EXCEEDS_CLAIM, AUDIT_REPORT_ARTIFACT, AUDIT_THREAT_MODELS, AUDIT_WHITE_BOX_CORRECT,
    AUDIT_WHITE_BOX_EPSILON_LOWER, AUDIT_WHITE_BOX_GUESSES, PRIVZO_KIND, SPEC_ARTIFACT)

ROOT = Path(__file__).resolve().parents[2]
PRIVZO = [sys.executable, "-m", "flows.cli"]

SPEC = {
    "name": "audit-flow", "seed": 5,
    "data": {"source": {"kind": "sklearn", "name": "digits"},
             "split": {"kind": "fraction", "public": 0.04, "test": 0.2}, "declared_private_rows": 64},
    "model": {"kind": "linear"},
    "estimator": {"kind": "two_point", "queries": 4, "smoothing": 1e-3},
    "mechanism": {"kind": "gaussian", "clip": 1.0, "noise_multiplier": 28.7},  # eps 0.9993: no calibration
    "privacy": {"epsilon": 1.0, "delta": 1e-5, "accountant": "rdp"},
    "sampling": {"kind": "poisson", "expected_batch_size": 32},
    "optimizer": {"kind": "sgd", "lr": 0.05, "steps": 60},
}


def _privzo(args, cwd, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(PRIVZO + args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.parametrize("change, args, message", [
    ({}, ["--canaries", "2"], "--canaries: 2 must be at least 4"),
    ({}, ["--confidence", "1"], "--confidence: 1.0 must be strictly between 0 and 1"),
    ({}, ["--noise-scale", "nan"], "--noise-scale: nan must be a finite number >= 0"),
    ({"mechanism": {"kind": "none"}, "privacy": None}, [], "mechanism.kind: none claims no privacy"),
    ({}, ["--runs", "5"], "--runs: 5 must be 1 (one-run audit) or at least 10"),
    ({}, ["--runs", "50", "--canaries", "20"], "--canaries: a many-runs audit (--runs 50) puts one canary"),
    ({"estimator": {"kind": "pazo_s", "public_batches": 2, "public_batch_size": 8}}, ["--guesses", "3"],
     "--guesses: a many-runs audit (--runs 100) guesses once per run"),  # PAZO-S: many runs by default
])
def test_audit_refuses_in_one_line_and_creates_nothing(tmp_path, change, args, message):
    spec = copy.deepcopy(SPEC)
    spec.update(change)
    spec = {k: v for k, v in spec.items() if v is not None}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = _privzo(["audit", str(path), *args], tmp_path)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]  # no MLflow store, no Prefect run


@pytest.mark.e2e
def test_audit_flow_logs_audit_tags_and_a_report(prefect_server, mlflow_db, monkeypatch):
    import torch

    import components.audit.run as audit_run
    import components.builders as builders
    from components.randomness import private_generator
    from flows.audit import privacy_audit

    # the canaries' inclusion and the run's noise from fixed seeds: a 95% lower bound from fresh noise lies
    # above the claim in up to 1 run of 20 by design (seen once in CI: 0.556 over 0.521), which says nothing
    # of the plumbing this test checks; tests/components/ hold the audit's statistics
    for module in (audit_run, builders):
        monkeypatch.setattr(module, "private_generator", lambda seed=None: private_generator(13 if seed is None else seed))

    uri = mlflow_db
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # not the audit's 1 (the suite runs on 1 thread, tests/conftest.py): a leak shows
    try:
        result = privacy_audit(spec=copy.deepcopy(SPEC), canaries=40, tracking_uri=uri, experiment="audits")
        assert torch.get_num_threads() == 2  # the audit's thread count does not leak
    finally:
        torch.set_num_threads(threads)
    assert result["epsilon_lower"] <= result["claimed_epsilon"] <= 1.0
    run = mlflow.MlflowClient(uri).get_run(result["run_id"])
    tags = run.data.tags
    assert float(tags[AUDIT_CLAIMED_EPSILON]) == pytest.approx(result["claimed_epsilon"], rel=1e-5)
    for key in (AUDIT_EPSILON_LOWER, AUDIT_WHITE_BOX_EPSILON_LOWER, AUDIT_BLACK_BOX_EPSILON_LOWER,
                AUDIT_CONFIDENCE, AUDIT_CANARIES, AUDIT_THREAT_MODELS, AUDIT_WHITE_BOX_GUESSES,
                AUDIT_WHITE_BOX_CORRECT, AUDIT_BLACK_BOX_GUESSES, AUDIT_BLACK_BOX_CORRECT):
        assert key in tags, key
    assert tags[AUDIT_CANARIES] == "40" and tags[AUDIT_CONFIDENCE] == "0.95"
    assert tags[AUDIT_EXCEEDS_CLAIM] == "false" and tags[PRIVZO_KIND] == "audit"
    assert not any(k.startswith("dp.") for k in tags)  # an audit makes no privacy claim of its own
    names = {a.path for a in mlflow.MlflowClient(uri).list_artifacts(result["run_id"])}
    assert {AUDIT_REPORT_ARTIFACT, AUDIT_ARTIFACT, AUDIT_CANARIES_ARTIFACT, SPEC_ARTIFACT} <= names
    report = result["report"]
    assert "| white-box |" in report and "| black-box |" in report and "No private row of the spec was read" in report


def test_the_docs_table_script_runs_its_smallest_cells(tmp_path):
    """bench/audit_table.py, which writes docs/audit.md's table: one correct and one broken cell, 10 steps."""
    out = subprocess.run([sys.executable, "bench/audit_table.py", "--specs", "specs/examples/digits_dpzero.yaml",
                          "--epsilons", "1", "--noise-scales", "0", "--steps", "10", "--canaries", "8"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| DPZero |")]
    assert len(rows) == 2 and "| as claimed |" in rows[0] and "| off |" in rows[1]
