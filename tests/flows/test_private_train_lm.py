"""End to end through the private-train entry point: language models read through a prompt (causal and masked
LMs by label words, a causal LM on completions), at bf16, with every estimator of the standard family: DPZero
(two_point), DPGD-0th, PAZO-M/P/S, DP-SGD (first_order) and the first-order baselines GEP, DOPE-SGD and PDA-DPMD.
The models are tiny and random (tests/components/tiny_lm.py); the step-0 evaluation is their zero-shot score."""
import math

import dp_accounting
import mlflow
import pandas as pd
import pytest
import torch

from specs import traits
from tests.components import tiny_lm
from flows.record.tracking_names import DERIVED_SAMPLING_RATE

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def lm_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm-run")
    pd.DataFrame(tiny_lm.reviews(120)).to_csv(root / "reviews.csv", index=False)
    pd.DataFrame(tiny_lm.completions(60)).to_json(root / "qa.jsonl", orient="records", lines=True)
    return {"root": root, **{arch: tiny_lm.save_model(root / arch, arch) for arch in ("llama", "bert")}}


# each estimator of the standard family at a small size: two queries, two public batches of 4 rows, 2 anchors
ESTIMATORS = {
    "two_point": {"kind": "two_point", "queries": 2, "smoothing": 1e-2},
    "dpgd_0th": {"kind": "dpgd_0th", "queries": 2, "smoothing": 1e-2},
    "pazo_m": {"kind": "pazo_m", "queries": 2, "smoothing": 1e-2, "public_batch_size": 4},
    "pazo_p": {"kind": "pazo_p", "queries": 2, "smoothing": 1e-2, "public_batches": 2, "public_batch_size": 4},
    "pazo_s": {"kind": "pazo_s", "public_batches": 2, "public_batch_size": 4},
    "first_order": {"kind": "first_order"},
    "gep": {"kind": "gep", "anchors": 2, "public_batch_size": 4},
    "dope_sgd": {"kind": "dope_sgd", "public_batch_size": 4},
    "pda_dpmd": {"kind": "pda_dpmd", "public_batch_size": 4},
}


def _spec(lm_files, uri, arch, estimator, task="label_words", steps=4):
    masked = arch == "bert"
    source = {"kind": "file", "path": str(lm_files["root"] / "reviews.csv"), "label": "label",
              "classes": ["neg", "pos"], "text": "text", "max_length": 16}
    prompt = {"kind": "label_words", "template": "{text} it was [MASK] ." if masked else "{text} it was",
              "words": ["bad", "good"]}
    if task == "completion":
        source = {"kind": "completions", "path": str(lm_files["root"] / "qa.jsonl"), "prompt": "q",
                  "completion": "a", "max_length": 16}
        prompt = {"kind": "completion", "template": "{text}"}
    split = {"kind": "fraction", "test": 0.2}
    if traits.ESTIMATORS[estimator].uses_public:
        split["public"] = 0.25
    return {"name": f"lm-{arch}-{estimator}-{task}", "seed": 5,
            "data": {"declared_private_rows": 100, "source": source, "split": split},
            "model": {"kind": "masked_lm" if masked else "causal_lm", "path": str(lm_files[arch]), "precision": "bf16",
                      "trainable": "all", "prompt": prompt},
            "estimator": dict(ESTIMATORS[estimator]),
            "mechanism": {"kind": "gaussian", "clip": 1.0}, "privacy": {"epsilon": 8.0, "delta": 1e-5},
            "sampling": {"kind": "poisson", "expected_batch_size": 8},
            "optimizer": {"kind": "sgd", "lr": 1.0, "steps": steps},
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


def test_every_standard_estimator_is_in_the_table_of_lm_runs_and_has_a_memory_plan(lm_files):
    """A new estimator of the standard family gets its language-model run below; each is planned from the model's
    config (components/memory_plan.py) before any row is read."""
    import specs
    from components import memory_plan

    assert set(ESTIMATORS) == set(traits.kinds(traits.ESTIMATORS, family=traits.STANDARD))
    for estimator in ESTIMATORS:
        for arch, task in (("llama", "label_words"), ("bert", "label_words"), ("llama", "completion")):
            plan = memory_plan.plan(specs.spec_from_dict(_spec(lm_files, "sqlite:///unused.db", arch, estimator, task)))
            assert plan.settings.estimator == estimator and plan.step > plan.sizes.weights > 0


@pytest.mark.parametrize("arch, estimator, task", [
    (arch, estimator, task) for estimator in ESTIMATORS for arch, task in (
        ("llama", "label_words"), ("bert", "label_words"), ("llama", "completion"))])
def test_every_standard_estimator_steps_a_prompted_lm_in_bf16(lm_files, arch, estimator, task):
    """The loop alone (no flow): two steps of every estimator on every kind of prompted language model, at bf16,
    leave finite weights that moved and a finite epsilon (the flow runs below cover a few end to end)."""
    import specs
    from tests.conftest import fixed_loop

    spec = _spec(lm_files, "sqlite:///unused.db", arch, estimator, task, steps=2)
    spec["mechanism"]["noise_multiplier"] = 1.0
    built = fixed_loop(spec)
    before = [p.detach().clone() for p in built.loop.backend.directions.params]
    built.loop.run(2)
    after = built.loop.backend.directions.params
    assert all(p.dtype == torch.bfloat16 and torch.isfinite(p).all() for p in after)
    assert any(not torch.equal(a, b) for a, b in zip(after, before))
    assert math.isfinite(built.loop.tracker.epsilon()) and specs.spec_from_dict(spec).model.precision == "bf16"


# end to end, the paths that differ from DPZero's and DP-SGD's (run above): a subspace basis in float32 (PAZO-P),
# a private selection (PAZO-S, on completions), public per-example gradients (GEP), a masked LM's public gradients
@pytest.mark.parametrize("arch, estimator, task", [
    ("llama", "pazo_p", "label_words"), ("llama", "gep", "label_words"), ("llama", "pazo_s", "completion"),
    ("bert", "pazo_m", "label_words"),
])
def test_every_estimator_trains_a_prompted_lm_through_the_flow_and_spends_what_the_accountant_says(
        prefect_server, lm_files, mlflow_db, tmp_path, monkeypatch, arch, estimator, task):
    """Two steps: the run finishes, its epsilon is dp-accounting's for the Poisson-sampled Gaussian it planned
    (one release a step whatever the estimator's queries: PAZO-S's two rounds and GEP's two parts share it), its
    step-0 evaluation is the zero-shot score computed here, and the test loss of the model it trained differs."""
    from flows.private_train import private_train

    monkeypatch.chdir(tmp_path)
    spec = _spec(lm_files, mlflow_db, arch, estimator, task, steps=2)
    spec["mechanism"]["noise_multiplier"] = 1.0  # checked against the target, not calibrated: a shorter test
    result = private_train(spec=spec)
    assert result["steps"] == 2
    client = mlflow.MlflowClient(mlflow_db)
    params = client.get_run(result["run_id"]).data.params
    step = dp_accounting.PoissonSampledDpEvent(float(params[DERIVED_SAMPLING_RATE]),
                                               dp_accounting.GaussianDpEvent(float(params["mechanism.noise_multiplier"])))
    spent = dp_accounting.rdp.RdpAccountant().compose(step, 2).get_epsilon(float(params["privacy.delta"]))
    assert result["epsilon"] == pytest.approx(spent, rel=1e-9) and 0 < spent <= 8.0
    zero_shot = _zero_shot(spec)
    for key in ("eval/exact_match" if task == "completion" else "eval/accuracy", "eval/loss"):
        history = sorted(client.get_metric_history(result["run_id"], key), key=lambda m: m.step)
        assert [m.step for m in history] == [0, 2]
        assert history[0].value == pytest.approx(zero_shot[key.split("/")[1]], rel=1e-6)
    loss = sorted(client.get_metric_history(result["run_id"], "eval/loss"), key=lambda m: m.step)
    assert math.isfinite(loss[1].value) and loss[1].value != loss[0].value  # trained


def test_a_run_over_the_device_memory_is_refused_before_any_row_is_read(prefect_server, lm_files, mlflow_db, tmp_path,
                                                                       monkeypatch):
    """components/memory_plan.py plans a language model from its config: a run that cannot fit the device (here 1 MiB,
    by PRIVZO_DEVICE_MEMORY_BYTES) is refused in one line before the flow reads a row or writes anything."""
    from components import builders, memory_plan
    from flows.private_train import private_train

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(memory_plan.MEMORY_ENV, str(2 ** 20))

    def no_rows(*_args, **_kwargs):
        raise AssertionError("a row was read before the memory plan")

    monkeypatch.setattr(builders, "load_data", no_rows)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ValueError, match=r"^execution: the run needs about [0-9.]+ MiB at its peak .*first_order: "
                                         r"float64 sums .* the device has 1 MiB \(PRIVZO_DEVICE_MEMORY_BYTES\)"):
        private_train(spec=_spec(lm_files, mlflow_db, "llama", "first_order"))
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no checkpoint folder, nothing else
