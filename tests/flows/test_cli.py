"""The privzo command line, run as a user would (subprocesses in a scratch directory; refusals that stop
before anything starts are called in this process)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import EXAMPLES

# imported here, outside any test's output capture: Prefect binds its log handlers to the streams it finds
# when first imported, and a capsys stream is closed after its test (the in-process refusals below)
import flows.private_train  # noqa: E402,F401
import flows.sweep  # noqa: E402,F401

PRIVZO = [sys.executable, "-m", "flows.cli"]
ROOT = Path(__file__).resolve().parents[2]


def _privzo(args, cwd, timeout=300, **env_extra):
    env = dict(os.environ, PYTHONPATH=str(ROOT), **env_extra)
    return subprocess.run(PRIVZO + args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def _in_process(args, cwd, monkeypatch, capsys, **env):
    """(exit code, stderr) of ``privzo args`` called in this process: for refusals, whose entry point (exit
    code, one stderr line) the subprocess tests cover; a new interpreter costs ~9 s of imports each."""
    from flows import cli

    monkeypatch.chdir(cwd)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    code = cli.main(args)
    return code, capsys.readouterr().err


def _write(tmp_path, data, name="spec.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d["estimator"].update(querys=2), "estimator.querys"),
        (lambda d: d["privacy"].update(epsilon=0), "privacy.epsilon"),
        (lambda d: d["privacy"].update(epsilon=-1), "privacy.epsilon"),
        (lambda d: d["data"]["split"].update(public=1.0), "data.split.public"),
        (lambda d: d["data"]["split"].update(public=1.5), "data.split.public"),
        (lambda d: d["model"].update(kind="transformer"), "model.kind"),
    ],
)
def test_validate_rejects_bad_spec_in_one_line_and_creates_nothing(tmp_path, tiny_spec_dict, mutate, field):
    mutate(tiny_spec_dict)
    path = _write(tmp_path, tiny_spec_dict)
    for command in ("validate", "run"):
        out = _privzo([command, str(path)], tmp_path, timeout=60)
        assert out.returncode == 2, out
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and field in lines[0], out.stderr
        assert "Traceback" not in out.stderr and out.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]  # no mlflow.db, no mlruns


def test_validate_accepts_examples(tmp_path):
    for path in sorted(EXAMPLES.glob("*.yaml")):
        out = _privzo(["validate", str(path)], tmp_path, timeout=60)
        assert out.returncode == 0 and out.stdout.startswith("ok: "), out


def test_missing_file_is_one_line(tmp_path):
    out = _privzo(["validate", str(tmp_path / "nope.yaml")], tmp_path, timeout=60)
    assert out.returncode == 2 and "cannot read spec" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_calibrate_prints_sigma_steps_rate_epsilon(tmp_path, tiny_spec_dict):
    out = _privzo(["calibrate", str(_write(tmp_path, tiny_spec_dict))], tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    values = dict(line.split(":", 1) for line in out.stdout.strip().splitlines())
    assert float(values["noise_multiplier (sigma)"]) > 0
    assert int(values["steps"]) == 60
    assert float(values["epsilon"].split()[0]) <= 2.0
    assert float(values["sampling rate"].split()[0]) > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]


def test_schema_is_valid_json(tmp_path):
    out = _privzo(["schema"], tmp_path, timeout=60)
    assert out.returncode == 0 and json.loads(out.stdout)["title"] == "RunSpec"


@pytest.mark.e2e
def test_run_reports_accuracy_privacy_and_mlflow(tmp_path, tiny_spec_dict):
    tiny_spec_dict["optimizer"]["steps"] = 40
    out = _privzo(["run", "--no-progress", str(_write(tmp_path, tiny_spec_dict))], tmp_path, timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "test accuracy" in out.stdout and "-DP for add/remove of one example of digits" in out.stdout
    assert "mlflow ui --backend-store-uri sqlite:///mlflow.db" in out.stdout
    assert (tmp_path / "mlflow.db").exists()


def test_calibrate_rejects_a_batch_larger_than_the_private_rows(tmp_path, tiny_spec_dict):
    tiny_spec_dict["sampling"]["expected_batch_size"] = 5000
    out = _privzo(["calibrate", str(_write(tmp_path, tiny_spec_dict))], tmp_path, timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "sampling.expected_batch_size: 5000" in lines[0]


def test_sweep_refuses_a_budgeted_or_registered_start_spec_and_creates_nothing(tmp_path, monkeypatch, capsys):
    """A sweep cell is charged to no ledger and starts from the seed: the nightly retraining spec, which
    promises both, is refused in one line before Prefect, MLflow or a ledger is touched."""
    code, err = _in_process(["sweep", str(EXAMPLES / "digits_retrain.yaml"), "--epsilons", "1", "--seeds", "0",
                             "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"], tmp_path, monkeypatch, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "digits-retrain" in lines[0] and "budget" in lines[0], err
    assert list(tmp_path.iterdir()) == []
    import specs
    from flows.sweep import refusal

    spec = specs.load_spec(EXAMPLES / "digits_retrain.yaml").model_dump(mode="json")
    spec.pop("budget")
    assert "optimizer.init" in refusal(specs.spec_from_dict(spec))
    spec["optimizer"]["init"] = "seed"
    assert refusal(specs.spec_from_dict(spec)) is None


@pytest.mark.parametrize("args, message", [
    (["--epsilons", "1", "inf"], "--epsilons: every epsilon must be a finite number > 0 (found inf)"),
    (["--epsilons", "nan"], "--epsilons: every epsilon must be a finite number > 0 (found nan)"),
    (["--epsilons", "-1"], "--epsilons: every epsilon must be a finite number > 0 (found -1)"),
    (["--seeds", "0", "-1"], "--seeds: every seed must be an integer >= 0 (found -1)"),
    (["--out", "/etc/passwd/table.md"], "--out: cannot write /etc/passwd/table.md (/etc/passwd is a file)"),
    (["--out", "."], "--out: . is a folder"),
])
def test_sweep_refuses_bad_arguments_in_one_line_before_anything_starts(tmp_path, monkeypatch, capsys, args, message):
    code, err = _in_process(["sweep", str(EXAMPLES / "digits_dpzero.yaml"), "--tracking-uri",
                             f"sqlite:///{tmp_path / 'mlflow.db'}", *args], tmp_path, monkeypatch, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err
    assert list(tmp_path.iterdir()) == []  # no Prefect, no MLflow database


@pytest.mark.parametrize("ledger, message", [
    (None, "budget: no ledger at sqlite:///{home}/.privzo/privacy-ledger.db (no file {home}/.privzo/privacy-ledger.db)"),
    ("sqlite:///missing/l.db", "budget: no ledger at sqlite:///missing/l.db"),
    ("notaurl", "--ledger: 'notaurl' is not a database URL"),
])
def test_budget_reads_a_ledger_without_creating_one(tmp_path, monkeypatch, capsys, ledger, message):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.delenv("PRIVZO_LEDGER_URL", raising=False)
    code, err = _in_process(["budget", "show", "patients", *(["--ledger", ledger] if ledger else [])], tmp_path,
                            monkeypatch, capsys, HOME=str(home))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message.format(home=home) in lines[0], err
    assert list(tmp_path.iterdir()) == [home] and list(home.iterdir()) == []


@pytest.mark.parametrize("mutate, args, message", [
    (lambda d: d["sampling"].update(expected_batch_size=5000), [],
     "sampling.expected_batch_size: 5000 is more than data.declared_private_rows"),
    (lambda d: d["model"].update(kind="mlp", hidden=[1_000_000, 1_000_000]), [], "model: 1e+12 parameters need"),
    (lambda d: d.update(checkpoint={"dir": "/etc/passwd"}), [], "checkpoint.dir: /etc/passwd is a file"),
    (lambda d: None, ["--resume", "nosuch"], "resume: no checkpoint .privzo/checkpoints/tiny-digits/nosuch"),
    (lambda d: None, ["--resume", "latest"], "resume: no checkpoint of tiny-digits under .privzo/checkpoints"),
])
def test_run_refuses_what_does_not_fit_before_prefect_starts(tmp_path, monkeypatch, capsys, tiny_spec_dict, mutate,
                                                             args, message):
    """Mistakes only the data, the model or the checkpoint folder reveal: one line, exit 2, nothing created
    (before, each came after a Prefect server start and its task tracebacks)."""
    mutate(tiny_spec_dict)
    spec = _write(tmp_path, tiny_spec_dict)
    code, err = _in_process(["run", "--no-progress", *args, str(spec)], tmp_path, monkeypatch, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]


def test_the_temporary_prefect_server_gets_time_to_start(tmp_path):
    """`privzo run` without a Prefect server starts a temporary one; Prefect's own 20 s allowance failed a
    first run on a busy 2-core machine, so privzo's flows package raises it before Prefect reads settings."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"}
    code = ("import flows.cli\nfrom prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS as s\n"
            "print(s.value())")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env=dict(env, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0 and int(out.stdout.strip()) >= 120, out.stderr
