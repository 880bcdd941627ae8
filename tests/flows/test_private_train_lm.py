"""End to end through the private-train entry point: language models read through a prompt (causal and masked
LMs by label words, a causal LM on completions), at bf16, with DPZero (two_point) and DP-SGD (first_order).
The models are tiny and random (tests/components/tiny_lm.py); the step-0 evaluation is their zero-shot score."""
import math

import mlflow
import pandas as pd
import pytest
import torch

from tests.components import tiny_lm

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def lm_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm-run")
    pd.DataFrame(tiny_lm.reviews(120)).to_csv(root / "reviews.csv", index=False)
    pd.DataFrame(tiny_lm.completions(60)).to_json(root / "qa.jsonl", orient="records", lines=True)
    return {"root": root, **{arch: tiny_lm.save_model(root / arch, arch) for arch in ("llama", "bert")}}


def _spec(lm_files, uri, arch, estimator, task="label_words"):
    masked = arch == "bert"
    source = {"kind": "file", "path": str(lm_files["root"] / "reviews.csv"), "label": "label",
              "classes": ["neg", "pos"], "text": "text", "max_length": 16}
    prompt = {"kind": "label_words", "template": "{text} it was [MASK] ." if masked else "{text} it was",
              "words": ["bad", "good"]}
    if task == "completion":
        source = {"kind": "completions", "path": str(lm_files["root"] / "qa.jsonl"), "prompt": "q",
                  "completion": "a", "max_length": 16}
        prompt = {"kind": "completion", "template": "{text}"}
    return {"name": f"lm-{arch}-{estimator}-{task}", "seed": 5,
            "data": {"declared_private_rows": 100, "source": source, "split": {"kind": "fraction", "test": 0.2}},
            "model": {"kind": "masked_lm" if masked else "causal_lm", "path": str(lm_files[arch]), "precision": "bf16",
                      "trainable": "all", "prompt": prompt},
            "estimator": {"kind": "two_point", "queries": 2, "smoothing": 1e-2} if estimator == "two_point"
            else {"kind": "first_order"},
            "mechanism": {"kind": "gaussian", "clip": 1.0}, "privacy": {"epsilon": 8.0, "delta": 1e-5},
            "sampling": {"kind": "poisson", "expected_batch_size": 8},
            "optimizer": {"kind": "sgd", "lr": 1.0, "steps": 4},
            "tracking": {"uri": uri, "log_every": 2}}


def _zero_shot(spec_dict):
    """The spec's model before any step, evaluated on its test split here, independently of the run."""
    import specs
    from components import builders, models

    spec = specs.spec_from_dict(spec_dict)
    data = builders.load_data(spec)
    model = builders.build_model(spec, data.n_features, data.n_classes).eval()
    return models.evaluate(model, torch.as_tensor(data.test.features), torch.as_tensor(data.test.labels))


@pytest.mark.parametrize("arch, estimator", [("llama", "two_point"), ("llama", "first_order"), ("bert", "two_point"),
                                             ("bert", "first_order")])
def test_a_label_word_run_logs_its_zero_shot_accuracy_at_step_0_and_registers_the_prompted_model(
        prefect_server, lm_files, mlflow_db, tmp_path, monkeypatch, arch, estimator):
    from flows.private_train import private_train

    monkeypatch.chdir(tmp_path)
    spec = _spec(lm_files, mlflow_db, arch, estimator)
    result = private_train(spec=spec)
    assert result["steps"] == 4 and math.isfinite(result["epsilon"]) and result["epsilon"] <= 8.0
    client = mlflow.MlflowClient(mlflow_db)
    for key in ("eval/accuracy", "eval/loss"):
        history = sorted(client.get_metric_history(result["run_id"], key), key=lambda m: m.step)
        assert [m.step for m in history] == [0, 2, 4]
        assert history[0].value == pytest.approx(_zero_shot(spec)[key.split("/")[1]], rel=1e-6)
    model = mlflow.pytorch.load_model(f"models:/{spec['name']}/{result['model_version']}")
    rows = torch.zeros(3, 3, 16, dtype=torch.long)
    rows[:, 0, :4] = torch.tensor([tiny_lm.VOCAB[w] for w in ("the", "movie", "was", "good")])
    rows[:, 1, :4], rows[:, 2, 3] = 1, 1
    assert model(rows).shape == (3, 2) and model(rows).dtype == torch.float32


def test_a_completion_run_logs_its_test_loss_and_exact_match_before_and_after(prefect_server, lm_files, mlflow_db,
                                                                              tmp_path, monkeypatch):
    from flows.private_train import private_train

    monkeypatch.chdir(tmp_path)
    spec = _spec(lm_files, mlflow_db, "llama", "two_point", task="completion")
    result = private_train(spec=spec)
    client = mlflow.MlflowClient(mlflow_db)
    loss = sorted(client.get_metric_history(result["run_id"], "eval/loss"), key=lambda m: m.step)
    assert [m.step for m in loss] == [0, 2, 4] and all(math.isfinite(m.value) and m.value > 0 for m in loss)
    assert loss[0].value == pytest.approx(_zero_shot(spec)["loss"], rel=1e-6)
    assert loss[-1].value != loss[0].value  # trained
    matched = client.get_metric_history(result["run_id"], "eval/exact_match")
    assert len(matched) == 3 and all(0.0 <= m.value <= 1.0 for m in matched)
    assert "eval/accuracy" not in client.get_run(result["run_id"]).data.metrics


def test_a_run_over_the_device_memory_is_refused_before_any_row_is_read(prefect_server, lm_files, mlflow_db, tmp_path,
                                                                       monkeypatch):
    """components/memory.py plans a language model from its config: a run that cannot fit the device (here 1 MiB,
    by PRIVZO_DEVICE_MEMORY_BYTES) is refused in one line before the flow reads a row or writes anything."""
    from components import builders, memory
    from flows.private_train import private_train

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(memory.MEMORY_ENV, str(2 ** 20))

    def no_rows(*_args, **_kwargs):
        raise AssertionError("a row was read before the memory plan")

    monkeypatch.setattr(builders, "load_data", no_rows)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ValueError, match=r"^execution: the run needs about [0-9.]+ MiB at its peak .*first_order: "
                                         r"float64 sums .* the device has 1 MiB \(PRIVZO_DEVICE_MEMORY_BYTES\)"):
        private_train(spec=_spec(lm_files, mlflow_db, "llama", "first_order"))
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no checkpoint folder, nothing else
