"""Spec layer: closed typed specs, one-line errors, auto resolution, no torch."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import specs
from tests.conftest import EXAMPLES, ROOT


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_spec_validates(path):
    spec = specs.load_spec(path)
    assert spec.name
    assert not spec.is_resolved  # examples leave sigma / delta to calibration


def test_examples_exist():
    assert (EXAMPLES / "digits_dpzero.yaml").exists()


def _error_for(tiny, mutate):
    mutate(tiny)
    with pytest.raises(specs.SpecError) as info:
        specs.spec_from_dict(tiny)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    "mutate, must_contain",
    [
        (lambda d: d["estimator"].update(querys=2), ["estimator.querys", "unknown key", "queries"]),
        (lambda d: d.update(optimiser={}), ["optimiser", "unknown key", "optimizer"]),
        (lambda d: d["privacy"].update(epsilon=0), ["privacy.epsilon", "greater than 0"]),
        (lambda d: d["privacy"].update(epsilon=-1.5), ["privacy.epsilon"]),
        (lambda d: d["privacy"].update(epsilon=float("inf")), ["privacy.epsilon", "finite number", "found inf"]),
        (lambda d: d["mechanism"].update(clip=float("nan")), ["mechanism.clip", "finite number", "found nan"]),
        # no silent coercion: YAML's true is not 1.0, a quoted "2.0" is not a number
        (lambda d: d["privacy"].update(epsilon=True), ["privacy.epsilon", "valid number", "found True"]),
        (lambda d: d["privacy"].update(epsilon="2.0"), ["privacy.epsilon", "valid number", "found '2.0'"]),
        (lambda d: d["privacy"].update(insecure_deterministic="yes"), ["privacy.insecure_deterministic", "'yes'"]),
        (lambda d: d.update(name="my run/2"), ["name: use letters, digits, '_', '.' and '-'", "(found 'my run/2')"]),
        (lambda d: d.update(tracking={"uri": "notaurl://x"}), ["tracking.uri", "unsupported scheme 'notaurl'",
                                                                "sqlite:///PATH"]),
        (lambda d: d["data"]["split"].update(public=1.0), ["data.split.public", "less than 1"]),
        (lambda d: d["model"].update(kind="resnet"), ["model.kind", "'resnet'", "'linear'", "'mlp'", "'cnn'"]),
        (lambda d: d["estimator"].update(kind="pazo_z"), ["estimator.kind", "'pazo_z'", "two_point"]),
        (lambda d: d["privacy"].update(delta=2), ["privacy.delta"]),
        (lambda d: d["optimizer"].pop("steps"), ["optimizer", "epochs or steps"]),
        (lambda d: d["optimizer"].update(epochs=3), ["optimizer", "not both"]),
        (lambda d: d["privacy"].update(neighboring="replace_one"), ["privacy.neighboring", "poisson"]),
        (lambda d: d.pop("mechanism"), ["mechanism", "missing"]),
        (lambda d: d["sampling"].update(expected_batch_size=0), ["sampling.expected_batch_size"]),
        (lambda d: d.update(mechanism={"kind": "none"}), ["privacy", "mechanism.kind none", "remove the privacy section"]),
        (lambda d: d.pop("privacy"), ["privacy: required"]),
        (lambda d: (d["data"]["split"].update(public=0.0, imbalance=None),
                    d.update(estimator={"kind": "pazo_s"})), ["estimator.kind", "pazo_s uses public data"]),
        (lambda d: d.update(estimator={"kind": "pazo_m", "mix": 1.5}), ["estimator.mix"]),
        (lambda d: d.update(estimator={"kind": "pazo_p", "basis": "qr"}), ["estimator.basis", "orthonormal"]),
        (lambda d: d.update(estimator={"kind": "two_point", "radius": 3.0}), ["estimator.radius", "sphere"]),
        (lambda d: d.update(estimator={"kind": "pazo_s", "candidate_noise": -1}), ["estimator.candidate_noise"]),
        (lambda d: (d.update(execution={"prefetch_directions": True}), d["estimator"].update(perturbation="regenerate")),
         ["execution.prefetch_directions", "cache or auto"]),
        (lambda d: d.update(execution={"prefetch_directions": True}, estimator={"kind": "pazo_s"}),
         ["execution.prefetch_directions", "pazo_s has no seeded directions"]),
        (lambda d: d.update(execution={"backend": "ray", "device": "cuda"}),
         ["execution.device: cuda with backend ray", "gpus_per_worker > 0", "device: cpu"]),
        (lambda d: d.update(execution={"backend": "ray", "workers": 3, "workers_per_node": 2}),
         ["execution.workers_per_node: 2 does not divide execution.workers (3)"]),
        (lambda d: d.update(execution={"backend": "ray", "cpus_per_worker": 0}), ["execution.cpus_per_worker"]),
        (lambda d: d.update(budget={"dataset": "x", "lifetime_epsilon": 1.0}), ["privacy.epsilon", "lifetime_epsilon"]),
        (lambda d: (d.update(budget={"dataset": "x", "lifetime_epsilon": 9.0}), d["privacy"].update(
            insecure_deterministic=True)), ["budget: only private runs"]),
        (lambda d: d.update(budget={"dataset": "bad name!", "lifetime_epsilon": 9.0}), ["budget.dataset"]),
        (lambda d: d.update(model={"kind": "hf", "name": "minilm"}), ["model.kind: hf", "data.source.kind: text"]),
        (lambda d: d["data"].update(source={"kind": "text", "name": "chatterbot"}),
         ["data.source.kind: text", "model.kind linear", "use model.kind: hf"]),
        (lambda d: (d["data"].update(source={"kind": "text", "name": "reddit"}), d.update(model={"kind": "hf", "name": "minilm"})),
         ["data.source.name", "'chatterbot'", "'reddit'"]),
        (lambda d: d["data"].update(source={"kind": "file", "path": "x.csv", "label": "y", "classes": [0, 1, "1"]}),
         ["data.source.classes", "distinct"]),
        (lambda d: d["data"].update(source={"kind": "file", "path": "x.csv", "label": "y", "classes": [0]}),
         ["data.source.classes", "at least 2"]),
        (lambda d: d["data"].update(source={"kind": "file", "path": "x.csv", "classes": [0, 1]}),
         ["data.source.label: required key is missing"]),
        (lambda d: d["data"].update(source={"kind": "file", "path": "x.csv", "label": "y", "classes": [0, 1],
                                            "format": "xlsx"}), ["data.source.format", "'csv'", "'parquet'"]),
        (lambda d: (d["data"].update(source={"kind": "file", "path": "x.csv", "label": "y", "classes": [0, 1]}),
                    d["data"]["split"].update(public=0.0, imbalance=None)),
         ["data.source.scale: public standardisation needs data.split.public > 0"]),
        (lambda d: d["data"]["split"].update(kind="random"), ["data.split.kind", "'fraction'", "'hashed'"]),
        (lambda d: (d["data"].update(source={"kind": "text", "name": "chatterbot"}), d.update(model={"kind": "hf", "name": "bert"})),
         ["model.name", "'minilm'"]),
        (lambda d: (d["data"].update(source={"kind": "text", "name": "chatterbot"}),
                    d.update(model={"kind": "hf", "name": "minilm", "trainable": "prefix"})), ["model.trainable", "'lora'"]),
        (lambda d: (d["data"].update(source={"kind": "text", "name": "chatterbot", "max_length": 1}),
                    d.update(model={"kind": "hf", "name": "minilm"})), ["data.source.max_length"]),
    ],
)
def test_bad_specs_name_the_field_in_one_line(tiny_spec_dict, mutate, must_contain):
    message = _error_for(tiny_spec_dict, mutate)
    for fragment in must_contain:
        assert fragment in message, message


def test_text_source_and_hf_model_validate_together(tiny_spec_dict):
    tiny_spec_dict["data"]["source"] = {"kind": "text", "name": "chatterbot"}
    tiny_spec_dict["model"] = {"kind": "hf", "name": "minilm"}
    spec = specs.spec_from_dict(tiny_spec_dict)
    # tokenizer None: the model's own (minilm here); a text source never names a vocabulary the model lacks
    assert (spec.data.source.max_length, spec.data.source.tokenizer, spec.model.trainable) == (32, None, "head")
    assert spec.model.weights == "minilm"
    assert specs.flatten(spec)["model.trainable"] == "head"


def test_mezo_spec_has_no_privacy_section(tiny_spec_dict):
    tiny_spec_dict["mechanism"] = {"kind": "none"}
    del tiny_spec_dict["privacy"]
    spec = specs.spec_from_dict(tiny_spec_dict)
    assert not spec.private
    resolved = spec.resolved(n_private=1000, noise_multiplier=None)
    assert resolved.is_resolved and resolved.privacy is None


def test_several_errors_are_reported_together(tiny_spec_dict):
    tiny_spec_dict["privacy"]["epsilon"] = 0
    tiny_spec_dict["model"]["kind"] = "resnet"
    message = _error_for(tiny_spec_dict, lambda d: None)
    assert "privacy.epsilon" in message and "model.kind" in message


def test_duplicate_yaml_keys_are_rejected():
    with pytest.raises(specs.SpecError, match="seed: duplicate key"):
        specs.parse_yaml("name: a\nseed: 1\nseed: 2\n")


def test_not_a_mapping_and_bad_yaml():
    with pytest.raises(specs.SpecError, match="expected a mapping"):
        specs.parse_yaml("- 1\n- 2\n")
    with pytest.raises(specs.SpecError, match="not valid YAML"):
        specs.parse_yaml("name: [unclosed\n")


def test_resolution_replaces_every_auto(tiny_spec_dict):
    spec = specs.spec_from_dict(tiny_spec_dict)
    resolved = spec.resolved(n_private=1000, noise_multiplier=1.25)
    assert resolved.is_resolved
    assert resolved.privacy.delta == pytest.approx(1 / 1385)  # 1 / data.declared_private_rows
    assert resolved.mechanism.noise_multiplier == 1.25
    assert resolved.optimizer.steps == 60
    # the resolved spec round-trips through YAML unchanged
    assert specs.spec_from_dict(yaml.safe_load(specs.dump_yaml(resolved))) == resolved


def test_epochs_resolve_to_steps(tiny_spec_dict):
    tiny_spec_dict["optimizer"].pop("steps")
    tiny_spec_dict["optimizer"]["epochs"] = 2.5
    spec = specs.spec_from_dict(tiny_spec_dict)
    resolved = spec.resolved(n_private=1000, noise_multiplier=1.0)
    assert resolved.optimizer.steps == 55  # ceil(2.5 * 1385 / 64), 1385 = data.declared_private_rows
    assert resolved.optimizer.epochs is None


def test_add_remove_constants_never_come_from_the_private_count(tiny_spec_dict):
    """Under add/remove, the rate, steps from epochs and delta auto are the same whatever the private count
    (docs/design.md, "Privacy invariants" 3): adding or removing a row moves none of them."""
    from components import builders

    tiny_spec_dict["optimizer"] = {"kind": "sgd", "lr": 0.02, "epochs": 3}
    spec = specs.spec_from_dict(tiny_spec_dict)
    plans = [builders.resolve_privacy(spec, n) for n in (None, 1, 1384, 1385, 1386, 10**6)]
    assert len({(r.privacy.delta, r.optimizer.steps, r.mechanism.noise_multiplier, rate, eps)
                for r, rate, eps in plans}) == 1
    resolved, rate, _ = plans[0]
    assert rate == 64 / 1385 and resolved.privacy.delta == 1 / 1385 and resolved.optimizer.steps == 65


@pytest.mark.parametrize("change, message", [
    (lambda d: d["data"].pop("declared_private_rows"), "data.declared_private_rows: required with neighboring add_remove"),
    (lambda d: d["sampling"].update(expected_batch_size=2000), "sampling.expected_batch_size: 2000 is more than"),
])
def test_declared_private_rows_rules(tiny_spec_dict, change, message):
    change(tiny_spec_dict)
    with pytest.raises(specs.SpecError, match=message):
        specs.spec_from_dict(tiny_spec_dict)


def test_under_replace_one_a_declared_count_must_be_the_true_one(tiny_spec_dict):
    from components import builders

    tiny_spec_dict["privacy"]["neighboring"] = "replace_one"
    tiny_spec_dict["sampling"] = {"kind": "fixed_size", "batch_size": 64}
    spec = specs.spec_from_dict(tiny_spec_dict)
    assert builders.resolve_privacy(spec, 1385)[0].privacy.delta == 1 / 1385
    with pytest.raises(ValueError, match="data.declared_private_rows: 1385, but the split has 1000 private rows"):
        builders.resolve_privacy(spec, 1000)


def test_replace_one_takes_the_private_count_and_says_so(tiny_spec_dict):
    from components import builders
    from flows.record.reporting import summarize

    tiny_spec_dict["data"].pop("declared_private_rows")
    tiny_spec_dict["privacy"]["neighboring"] = "replace_one"
    tiny_spec_dict["sampling"] = {"kind": "fixed_size", "batch_size": 64}
    spec = specs.spec_from_dict(tiny_spec_dict)
    resolved, rate, eps = builders.resolve_privacy(spec, 1000)
    assert rate == 64 / 1000 and resolved.privacy.delta == 1e-3
    sentence = summarize(resolved, eps, 60, builders.spec_sampler(resolved, 1000), 2).guarantee()
    assert "replacement of one example" in sentence and "number of private rows (1000)" in sentence
    assert "releases it" in sentence


def test_flatten_gives_dotted_params(tiny_spec_dict):
    flat = specs.flatten(specs.spec_from_dict(tiny_spec_dict))
    assert flat["estimator.queries"] == "2"
    assert flat["data.source.name"] == "digits"


def test_schema_is_json_with_every_section():
    schema = json.loads(specs.json_schema())
    assert {"data", "model", "estimator", "mechanism", "privacy", "sampling", "optimizer"} <= set(schema["properties"])


def test_specs_never_import_torch():
    code = "import sys, specs; specs.load_spec(sys.argv[1]); bad = [m for m in ('torch', 'ray', 'prefect', 'mlflow') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    out = subprocess.run([sys.executable, "-c", code, str(EXAMPLES / "digits_dpzero.yaml")], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_auto_device_keeps_ray_drivers_with_their_workers(tiny_spec_dict, monkeypatch):
    """On a GPU machine, auto puts a local run on the GPU, and a Ray run's driver there only when its
    workers get GPUs too (both must draw the same directions, and a GPU's are not the CPU's)."""
    import torch

    from components import builders

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    local = specs.spec_from_dict(dict(tiny_spec_dict, execution={"backend": "local"}))
    ray_cpu = specs.spec_from_dict(dict(tiny_spec_dict, execution={"backend": "ray"}))
    ray_gpu = specs.spec_from_dict(dict(tiny_spec_dict, execution={"backend": "ray", "gpus_per_worker": 0.5}))
    assert [builders.device_for(s).type for s in (local, ray_cpu, ray_gpu)] == ["cuda", "cpu", "cuda"]


@pytest.mark.parametrize("field, value, message", [
    ("delta", 1.0, "privacy.delta: Input should be less than 1, or 'auto' (found 1.0)"),
    ("delta", "1/n", "privacy.delta: Input should be a valid number, or 'auto' (found '1/n')"),
])
def test_a_number_or_auto_field_gets_one_message_without_pydantic_branch_names(tiny_spec_dict, field, value, message):
    tiny_spec_dict["privacy"][field] = value
    with pytest.raises(specs.SpecError) as err:
        specs.spec_from_dict(tiny_spec_dict)
    assert str(err.value) == message


@pytest.mark.parametrize("content, message", [
    (b"\xff\xfe", "cannot read spec (not UTF-8 text: byte 0xff at position 0)"),
    (b"", "the spec is empty"),
    (b"name: a\nname: b\n", "name: duplicate key at line 2"),
    (b"name: x\n", "data: required key is missing"),
])
def test_file_errors_name_the_file(tmp_path, content, message):
    path = tmp_path / "spec.yaml"
    path.write_bytes(content)
    with pytest.raises(specs.SpecError) as err:
        specs.load_spec(path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)


def test_a_relative_data_path_is_taken_from_the_spec_files_folder(tmp_path, monkeypatch, tiny_spec_dict):
    """A Prefect worker runs from its own working directory: the spec carries the path it was written with."""
    (tmp_path / "specs").mkdir()
    tiny_spec_dict["data"]["source"] = {"kind": "file", "path": "../data/rows.csv", "label": "y", "classes": [0, 1]}
    spec_file = tmp_path / "specs" / "mine.yaml"
    spec_file.write_text(yaml.safe_dump(tiny_spec_dict))
    monkeypatch.chdir("/")
    spec = specs.load_spec(spec_file)
    assert spec.data.source.path == str(tmp_path / "data" / "rows.csv")
    assert spec.data.source.name == "rows.csv"
    tiny_spec_dict["data"]["source"]["path"] = str(tmp_path / "abs.parquet")
    spec_file.write_text(yaml.safe_dump(tiny_spec_dict))
    assert specs.load_spec(spec_file).data.source.path == str(tmp_path / "abs.parquet")


FILE = {"kind": "file", "path": "x.csv", "label": "y", "classes": [0, 1]}


@pytest.mark.parametrize("source, split, message", [
    ({"kind": "sklearn", "name": "digits"}, {"kind": "column", "column": "ok"},
     "data.split.kind: column reads a column of a file or sql source"),
    (FILE, {"kind": "column", "column": "y"}, "data.split.column: 'y' is the label or a feature"),
    (FILE, {"kind": "source", "public_source": {"kind": "text", "name": "chatterbot"}},
     "data.split.public_source: its rows must be read like the main source's"),
    (FILE, {"kind": "source", "public_source": {**FILE, "classes": [1, 0]}},
     "data.split.public_source.classes: must be data.source.classes, in the same order"),
    (FILE, {"kind": "source", "public_source": {**FILE, "scale": "none"}},
     "data.split.public_source.scale: the main source's scale applies to both"),
    (FILE, {"kind": "column", "column": "ok", "public": 0.1}, "data.split.public: unknown key"),
])
def test_public_rows_by_column_or_source_spec_errors(tiny_spec_dict, source, split, message):
    tiny_spec_dict["data"] = {"source": source, "split": split, "declared_private_rows": 1384}
    with pytest.raises(specs.SpecError, match=message):
        specs.spec_from_dict(tiny_spec_dict)


def test_column_and_source_splits_count_as_public_data(tiny_spec_dict, tmp_path):
    tiny_spec_dict["estimator"] = {"kind": "pazo_s"}
    tiny_spec_dict["data"] = {"source": FILE, "split": {"kind": "column", "column": "consented"},
                              "declared_private_rows": 1384}
    specs.spec_from_dict(tiny_spec_dict)
    tiny_spec_dict["data"]["split"] = {"kind": "source", "public_source": {**FILE, "path": "public/rows.csv"}}
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text(yaml.safe_dump(tiny_spec_dict))
    spec = specs.load_spec(spec_file)
    assert spec.data.split.public_source.path == str(tmp_path / "public" / "rows.csv")


@pytest.mark.parametrize("source", [FILE, {**FILE, "text": "body"}, {**FILE, "text": "body", "max_length": 16}],
                         ids=["numbers", "text", "text-16"])
def test_a_file_source_survives_resolution(tiny_spec_dict, source):
    """A run logs and replays the resolved spec: it must validate again with every default written out."""
    tiny_spec_dict["data"]["source"] = source
    if "text" in source:
        tiny_spec_dict["model"] = {"kind": "hf", "name": "minilm"}
    spec = specs.spec_from_dict(tiny_spec_dict)
    again = spec.resolved(n_private=1000, noise_multiplier=1.0)
    assert again.data.source == spec.data.source
    # with a text column: 32 tokens by default, and the model's own tokenizer (None) unless one is named
    assert (spec.data.source.max_length, spec.data.source.tokenizer) == (
        (source.get("max_length", 32), None) if "text" in source else (None, None))


@pytest.mark.parametrize("split", [{"kind": "column", "column": "consented"},
                                   {"kind": "source", "public_source": {**FILE, "path": "/data/public.csv"}},
                                   {"kind": "hashed", "public": 0.1}], ids=["column", "source", "hashed"])
def test_every_split_survives_resolution(tiny_spec_dict, split):
    tiny_spec_dict["data"] = {"source": FILE, "split": split, "declared_private_rows": 1384}
    spec = specs.spec_from_dict(tiny_spec_dict)
    assert spec.resolved(n_private=1000, noise_multiplier=1.0).data == spec.data


def test_an_unknown_key_in_an_optional_section_lists_that_sections_keys(tiny_spec_dict):
    tiny_spec_dict["estimator"]["public_warm_start"] = {"epochs": 1.0, "bogus": 2}
    with pytest.raises(specs.SpecError, match=r"estimator.public_warm_start.bogus: unknown key; allowed keys here: "
                                              r"epochs, lr, batch_size"):
        specs.spec_from_dict(tiny_spec_dict)
    tiny_spec_dict["estimator"].pop("public_warm_start")
    tiny_spec_dict["data"]["source"] = {"kind": "text", "name": "chatterbot"}
    tiny_spec_dict["model"] = {"kind": "hf", "name": "minilm", "trainable": "lora", "lora": {"dropout": 0.1}}
    with pytest.raises(specs.SpecError, match=r"model.lora.dropout: unknown key; allowed keys here: rank, alpha, targets"):
        specs.spec_from_dict(tiny_spec_dict)


def test_an_unnamed_tracking_store_and_ledger_come_from_the_environment(tiny_spec_dict, monkeypatch):
    tiny_spec_dict["budget"] = {"dataset": "digits", "lifetime_epsilon": 8.0}
    # mlflow.set_tracking_uri (called by every run in this process) sets MLFLOW_TRACKING_URI itself
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("PRIVZO_LEDGER_URL", raising=False)
    spec = specs.spec_from_dict(tiny_spec_dict)
    home_ledger = f"sqlite:///{Path.home() / '.privzo' / 'privacy-ledger.db'}"  # the same from any folder
    assert (spec.tracking.uri, spec.budget.ledger) == ("sqlite:///mlflow.db", home_ledger)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    monkeypatch.setenv("PRIVZO_LEDGER_URL", "postgresql+psycopg://privzo@db/ledger")
    spec = specs.spec_from_dict(tiny_spec_dict)
    assert (spec.tracking.uri, spec.budget.ledger) == ("http://127.0.0.1:5000", "postgresql+psycopg://privzo@db/ledger")
    # the resolved spec, the one logged, carries the values used: it means the same under any environment
    resolved = spec.resolved(n_private=1000, noise_multiplier=1.0)
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.delenv("PRIVZO_LEDGER_URL")
    assert specs.spec_from_dict(yaml.safe_load(specs.dump_yaml(resolved))) == resolved
    # a spec that names them wins over the environment
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://elsewhere:5000")
    tiny_spec_dict["tracking"]["uri"] = "sqlite:///mine.db"
    assert specs.spec_from_dict(tiny_spec_dict).tracking.uri == "sqlite:///mine.db"


def test_a_bad_tracking_uri_from_the_environment_says_where_it_came_from(tiny_spec_dict, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "ftp://host/store")
    with pytest.raises(specs.SpecError) as info:
        specs.spec_from_dict(tiny_spec_dict)
    assert "tracking.uri" in str(info.value) and "MLFLOW_TRACKING_URI" in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("ledger, message", [
    ("sqlite:///privacy-ledger.db", "a relative SQLite path names another ledger from every folder privzo runs in"),
    ("sqlite:///../l.db", "a relative SQLite path"),
    ("sqlite://", "an in-memory SQLite ledger forgets every run when its process ends"),
    ("sqlite:///:memory:", "an in-memory SQLite ledger"),
    ("sqlite:///file:l?mode=memory&uri=true", "an in-memory SQLite ledger"),
])
def test_a_ledger_must_be_the_same_from_every_folder(tiny_spec_dict, ledger, message, monkeypatch, tmp_path):
    """Two folders, two relative ledgers: runs started in each see only their own total and could
    together pass the lifetime budget; an in-memory ledger forgets them all."""
    monkeypatch.chdir(tmp_path)
    tiny_spec_dict["budget"] = {"dataset": "digits", "lifetime_epsilon": 8.0, "ledger": ledger}
    text = _error_for(tiny_spec_dict, lambda d: None)
    assert text.startswith("budget.ledger: ") and message in text
    if "relative" in message and ".." not in ledger:
        assert f"as this folder's: sqlite:///{tmp_path / 'privacy-ledger.db'}" in text
    tiny_spec_dict["budget"]["ledger"] = f"sqlite:///{tmp_path / 'l.db'}"
    assert specs.spec_from_dict(tiny_spec_dict).budget.ledger == f"sqlite:///{tmp_path / 'l.db'}"
    del tiny_spec_dict["budget"]["ledger"]
    monkeypatch.setenv("PRIVZO_LEDGER_URL", ledger)
    assert "PRIVZO_LEDGER_URL" in _error_for(tiny_spec_dict, lambda d: None)


def test_a_delta_above_one_over_the_declared_rows_is_refused_at_validation(tiny_spec_dict):
    """A mechanism that publishes one random row whole is (0, 1/N)-DP: a delta above 1/N promises nothing of any
    one row. Under add/remove N is data.declared_private_rows, public, so the spec alone is refused."""
    message = _error_for(tiny_spec_dict, lambda d: d["privacy"].update(delta=0.5))
    assert message == ("privacy.delta: 0.5 is above 1/N = 1/1385 = 0.000722022 (N: data.declared_private_rows): not a "
                       "meaningful guarantee (publishing one random row whole meets it); use delta: auto (1/N) or "
                       "smaller, e.g. 1e-05, or set privacy.allow_large_delta: true to run anyway (the run is "
                       "labelled)")
    for delta in (1e-6, 1 / 1385, "auto"):  # 1/N itself, what auto gives, is the largest accepted
        tiny_spec_dict["privacy"]["delta"] = delta
        spec = specs.spec_from_dict(tiny_spec_dict)
        assert not spec.large_delta() and spec.delta_for() == pytest.approx(1 / 1385 if delta == "auto" else delta)
    tiny_spec_dict["privacy"].update(delta=0.5, allow_large_delta=True)
    spec = specs.spec_from_dict(tiny_spec_dict)
    resolved = spec.resolved(noise_multiplier=1.0)
    assert spec.large_delta() and resolved.large_delta() and resolved.privacy.delta == 0.5
    tiny_spec_dict["privacy"]["delta"] = 1e-6  # allowed, not used: nothing to label
    assert not specs.spec_from_dict(tiny_spec_dict).large_delta()
    tiny_spec_dict["privacy"]["delta"] = "auto"
    assert _error_for(tiny_spec_dict, lambda d: None) == ("privacy.allow_large_delta: delta auto is 1/N, never above "
                                                          "it; remove allow_large_delta")


def test_under_replace_one_a_large_delta_is_refused_once_the_rows_are_counted(tiny_spec_dict):
    """The private count is N under replace_one, known after loading: planning refuses, before a run starts or
    a budget is reserved (privzo calibrate and run plan first); every optimizer's plan reads delta_for."""
    from components import builders

    tiny_spec_dict["data"].pop("declared_private_rows")
    tiny_spec_dict["privacy"].update(neighboring="replace_one", delta=0.001)
    tiny_spec_dict["sampling"] = {"kind": "fixed_size", "batch_size": 64}
    spec = specs.spec_from_dict(tiny_spec_dict)  # N unknown here: accepted
    assert builders.resolve_privacy(spec, 1000)[0].privacy.delta == 0.001  # 1/N exactly
    with pytest.raises(ValueError, match=r"^privacy.delta: 0.001 is above 1/N = 1/1001 = 0.000999001 \(N: the private "
                                         r"rows\): not a meaningful guarantee .* e.g. 1e-05, or set "
                                         r"privacy.allow_large_delta: true"):
        builders.resolve_privacy(spec, 1001)
    tiny_spec_dict["privacy"]["allow_large_delta"] = True
    spec = specs.spec_from_dict(tiny_spec_dict)
    resolved = builders.resolve_privacy(spec, 1001)[0]
    assert resolved.privacy.delta == 0.001 and resolved.large_delta(1001) and not resolved.large_delta(1000)
    o2nc = specs.load_spec(EXAMPLES / "p1_o2nc_001.yaml").model_dump(mode="json")
    o2nc["privacy"]["delta"] = 0.01
    with pytest.raises(ValueError, match=r"^privacy.delta: 0.01 is above 1/N = 1/10000 = 0.0001 \(N: the private "
                                         r"rows\)"):
        builders.resolve_privacy(specs.spec_from_dict(o2nc), 10_000, 4)


@pytest.mark.parametrize("example, former, name", [("p1_o2nc_001", "001", "original"), ("p1_o2nc_002", "002", "improved")])
def test_zo_spider_variants_former_names_load_as_the_new_ones(example, former, name):
    """estimator.variant "001" and "002" (the examples still write them) are read as original and improved: the
    spec loads as if the new name were written, and the spec, resolved or not, dumps the new name."""
    from components import builders

    spec = specs.load_spec(EXAMPLES / f"{example}.yaml")
    data = spec.model_dump(mode="json")
    assert spec.estimator.variant == name and data["estimator"]["variant"] == name
    assert f"variant: {name}" in specs.dump_yaml(spec)
    data["estimator"]["variant"] = former
    assert specs.spec_from_dict(data) == spec
    data["data"]["source"]["rows"] = 600
    small = specs.spec_from_dict(data)
    resolved, _, _ = builders.plan(small, builders.load_data(small))
    assert resolved.estimator.variant == name and f"variant: {name}" in specs.dump_yaml(resolved)
