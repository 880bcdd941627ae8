"""The language-model examples (specs/examples/chatterbot_lm_*.yaml) as a new user meets them, at a tiny size:
the decoder they name (~/.privzo/models/privzo-decoder-v1) made by the public recipe (recipes/pretrain_decoder.py)
with tiny settings in a home of the test's own, then `privzo validate` and `privzo calibrate` on the example as shipped and
`privzo run` on it with two steps; the run prints the zero-shot score, the final score and (ε, δ)."""
import os
import re
import subprocess
import sys

import pytest
import yaml

import specs
from tests.conftest import EXAMPLES, ROOT

pytestmark = pytest.mark.e2e

LM_EXAMPLES = sorted(EXAMPLES.glob("chatterbot_lm_*.yaml"))
# one layer of width 64 on 0.3 MB of text: the recipe's every stage, in seconds
TINY = ["--steps", "2", "--layers", "1", "--hidden", "64", "--vocab", "1024", "--corpus-mb", "0.3", "--batch", "2",
        "--context", "32"]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    sys.path.insert(0, str(ROOT / "recipes"))
    try:
        import pretrain_decoder
    finally:
        sys.path.pop(0)
    out = home / ".privzo" / "models" / "privzo-decoder-v1"
    assert pretrain_decoder.main(TINY + ["--out", str(out)]) == 0
    assert pretrain_decoder.main(TINY + ["--out", str(out)]) == 0  # the second call finds it made: cached
    with pytest.raises(SystemExit, match="other settings"):
        pretrain_decoder.main(["--steps", "3"] + TINY[2:] + ["--out", str(out)])
    return home


def test_the_examples_cover_label_words_with_dpzero_and_pazo_m_and_generation():
    kinds = {(s["estimator"]["kind"], s["model"]["prompt"]["kind"])
             for s in (yaml.safe_load(p.read_text()) for p in LM_EXAMPLES)}
    assert {("two_point", "label_words"), ("pazo_m", "label_words"), ("two_point", "completion")} <= kinds


@pytest.mark.parametrize("path", LM_EXAMPLES, ids=lambda p: p.stem)
def test_an_lm_example_validates_and_runs_printing_zero_shot_final_and_epsilon_delta(
        path, home, tmp_path, monkeypatch, capsys, prefect_server):
    from flows.cli import main

    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    assert main(["validate", str(path)]) == 0
    assert capsys.readouterr().out.startswith("ok: ")
    spec = specs.load_spec(path).model_dump(mode="json")  # paths made absolute, ~ expanded to the test's home
    assert spec["model"]["path"] == str(home / ".privzo" / "models" / "privzo-decoder-v1")
    if spec["data"]["source"]["kind"] == "completions":  # the tiny vocabulary spells a reply in more tokens
        spec["data"]["source"]["max_length"] = 192
    calibrating = tmp_path / "calibrate.yaml"
    calibrating.write_text(yaml.safe_dump(spec))
    assert main(["calibrate", str(calibrating)]) == 0
    calibrated = dict(line.split(":", 1) for line in capsys.readouterr().out.splitlines() if ":" in line)
    assert float(calibrated["noise_multiplier (sigma)"]) > 0 and int(calibrated["steps"]) == 200
    assert float(calibrated["epsilon"].split()[0]) <= 4.0
    spec["optimizer"]["steps"] = 2
    spec["tracking"].update(uri=f"sqlite:///{tmp_path / 'mlflow.db'}", log_every=2)
    tiny = tmp_path / path.name
    tiny.write_text(yaml.safe_dump(spec))
    # as the user runs it, in a process of its own (Prefect's log handlers outlive a test's captured streams)
    out = subprocess.run([sys.executable, "-m", "flows.cli", "run", "--no-progress", str(tiny)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PYTHONPATH=str(ROOT), HOME=str(home), PREFECT_API_URL=prefect_server))
    assert out.returncode == 0, out.stderr[-3000:]
    name = spec["name"]
    assert re.search(rf"^{re.escape(name)} zero-shot: test [a-z ]+ [0-9.]+, ", out.stdout, re.M), out.stdout
    assert re.search(rf"^{re.escape(name)}: test [a-z ]+ [0-9.]+, ", out.stdout, re.M), out.stdout
    assert re.search(r"^privacy: \([0-9.]+, [0-9.e-]+\)-DP ", out.stdout, re.M), out.stdout
