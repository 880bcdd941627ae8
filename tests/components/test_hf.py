"""The hf model: pretrained MiniLM + mean pooling + a public-seeded head; only trainable parameters move."""
import copy

import pytest
import torch

import specs
from components import builders, models, pretrained
from components.randomness import private_generator


@pytest.fixture
def hf_spec_dict(tiny_spec_dict):
    tiny_spec_dict["data"]["source"] = {"kind": "text", "name": "chatterbot", "max_length": 16}
    tiny_spec_dict["model"] = {"kind": "hf", "name": "minilm", "trainable": "bias"}
    tiny_spec_dict["estimator"] = {"kind": "two_point", "queries": 1, "smoothing": 1e-3}
    tiny_spec_dict["sampling"]["expected_batch_size"] = 16
    tiny_spec_dict["optimizer"] = {"kind": "sgd", "lr": 1e-3, "steps": 3}
    return tiny_spec_dict


@pytest.fixture(scope="module")
def text_data():
    spec = specs.spec_from_dict({
        "name": "t", "seed": 3, "data": {"declared_private_rows": 1000, "source": {"kind": "text", "name": "chatterbot", "max_length": 16},
                                         "split": {"kind": "fraction", "public": 0.04, "test": 0.2}},
        "model": {"kind": "hf", "name": "minilm"}, "estimator": {"kind": "two_point"},
        "mechanism": {"kind": "none"}, "sampling": {"kind": "poisson"}, "optimizer": {"kind": "sgd", "lr": 1.0, "steps": 1}})
    return builders.load_data(spec)


def _model(spec_dict, data, **model):
    d = copy.deepcopy(spec_dict)
    d["model"].update(model)
    return builders.build_model(specs.spec_from_dict(d), data.n_features, data.n_classes)


def test_builds_from_the_package_and_forwards_a_few_rows(hf_spec_dict, text_data):
    state = torch.random.get_rng_state()
    model = _model(hf_spec_dict, text_data)
    assert torch.equal(state, torch.random.get_rng_state())  # head drawn from its own public generator
    x, y = torch.as_tensor(text_data.test.features[:4]), torch.as_tensor(text_data.test.labels[:4])
    logits = model(x)
    assert logits.shape == (4, 21) and torch.isfinite(logits).all()
    assert models.per_example_loss(model, x, y).shape == (4,)
    # padding does not change a row's logits: pooling reads the mask
    padded = torch.cat([x, torch.zeros(4, 2, 8, dtype=x.dtype)], dim=2)
    assert torch.allclose(model(padded), logits, atol=1e-5)
    reference = pretrained.encoder("minilm")
    assert model.encoder.pooler is None
    assert all(torch.equal(p, q) for p, q in zip(model.encoder.parameters(), reference.parameters()))
    again = _model(hf_spec_dict, text_data)
    assert torch.equal(again.head.weight, model.head.weight)
    other = copy.deepcopy(hf_spec_dict)
    other["seed"] += 1
    assert not torch.equal(_model(other, text_data).head.weight, model.head.weight)


@pytest.mark.parametrize("trainable, tensors", [("head", 2), ("bias", 2 + 1 + 6 * 8), ("all", 2 + 101),
                                                ("all_but_embeddings", 2 + 101 - 3)])
def test_trainable_chooses_what_requires_grad(hf_spec_dict, text_data, trainable, tensors):
    model = _model(hf_spec_dict, text_data, trainable=trainable)
    params = dict(model.named_parameters())
    chosen = {n for n, p in params.items() if p.requires_grad}
    assert len(chosen) == tensors and {"head.weight", "head.bias"} <= chosen
    if trainable == "bias":
        assert all(n.endswith("bias") for n in chosen - {"head.weight"})
    if trainable == "all_but_embeddings":  # word, position and token-type tables frozen; their LayerNorm trains
        assert not any(n.endswith("_embeddings.weight") for n in chosen)
        assert "encoder.embeddings.LayerNorm.weight" in chosen
    assert [id(p) for p in models.trainable_parameters(model)] == [id(params[n]) for n in params if n in chosen]


def _run(spec_dict, data, steps):
    spec = specs.spec_from_dict(spec_dict)
    resolved, _, _ = builders.resolve_privacy(spec, len(data.private))
    built = builders.build_loop(resolved, data, noise_generator=private_generator(1),
                                sampling_generator=private_generator(2))
    before = {n: p.detach().clone() for n, p in built.model.named_parameters()}
    built.loop.run(steps)
    moved = {n for n, p in built.model.named_parameters() if not torch.equal(p, before[n])}
    return built, moved


def test_a_short_local_run_moves_only_trainable_parameters(hf_spec_dict, text_data):
    built, moved = _run(hf_spec_dict, text_data, 3)
    trainable = {n for n, p in built.model.named_parameters() if p.requires_grad}
    assert moved == trainable  # every bias and the head moved; no frozen weight did
    assert built.loop.backend.directions.dim == sum(p.numel() for p in models.trainable_parameters(built.model))


def test_public_gradients_reach_the_trainable_parameters(hf_spec_dict, text_data):
    hf_spec_dict["model"]["trainable"] = "head"
    hf_spec_dict["estimator"] = {"kind": "pazo_m", "queries": 1, "public_batch_size": 8}
    built, moved = _run(hf_spec_dict, text_data, 1)
    assert moved == {"head.weight", "head.bias"}
    grads = built.loop.public.gradient(torch.arange(8))
    assert [g.shape for g in grads] == [p.shape for p in models.trainable_parameters(built.model)]
    assert all(float(g.abs().sum()) > 0 for g in grads)


@pytest.fixture(scope="module")
def saved_minilm(tmp_path_factory):
    """The team's own encoder: here the packaged MiniLM written to a folder by save_pretrained."""
    folder = tmp_path_factory.mktemp("models") / "support-encoder"
    pretrained.encoder("minilm").save_pretrained(folder)
    pretrained.tokenizer("minilm").save_pretrained(folder)
    return folder


def test_a_local_model_folder_gives_the_same_classifier_as_its_package(hf_spec_dict, text_data, saved_minilm):
    from_package = _model(hf_spec_dict, text_data)
    d = copy.deepcopy(hf_spec_dict)
    d["model"] = {"kind": "hf", "path": str(saved_minilm), "trainable": "bias"}
    from_folder = builders.build_model(specs.spec_from_dict(d), text_data.n_features, text_data.n_classes)
    rows = torch.as_tensor(text_data.test.features[:8])
    with torch.inference_mode():
        torch.testing.assert_close(from_folder(rows), from_package(rows), rtol=0, atol=0)
    assert [n for n, p in from_folder.named_parameters() if p.requires_grad] == [
        n for n, p in from_package.named_parameters() if p.requires_grad]


def test_a_files_text_is_tokenised_by_the_models_own_folder(tmp_path, tiny_spec_dict, saved_minilm):
    import pandas as pd
    import yaml

    pd.DataFrame({"body": [f"ticket {i} about {'billing' if i % 2 else 'login'}" for i in range(200)],
                  "queue": ["billing" if i % 2 else "login" for i in range(200)]}).to_csv(tmp_path / "t.csv", index=False)
    tiny_spec_dict["data"] = {"declared_private_rows": 1000, "source": {"kind": "file", "path": "t.csv", "label": "queue", "classes": ["login", "billing"],
                                         "text": "body", "max_length": 12}, "split": {"kind": "hashed", "public": 0.1}}
    tiny_spec_dict["model"] = {"kind": "hf", "path": str(saved_minilm)}
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(tiny_spec_dict))
    spec = specs.load_spec(spec_file)
    data = builders.load_data(spec)  # tokenizer: the model folder's, since the source names none
    expected = pretrained.tokenizer("minilm")("ticket 0 about login", padding="max_length", max_length=12)["input_ids"]
    assert expected in data.private.features[:, 0].tolist() + data.test.features[:, 0].tolist() + \
        data.public.features[:, 0].tolist()


@pytest.mark.parametrize("model, source_extra, message", [
    ({"kind": "hf", "name": "minilm", "path": "/models/x"}, {}, "give name .* or path .*, one of them"),
    ({"kind": "hf"}, {}, "give name .* or path .*, one of them"),
    ({"kind": "hf", "path": "/models/x"}, {"tokenizer": "minilm"},
     r"data.source.tokenizer: 'minilm' is not the model's \('/models/x'\)"),
])
def test_model_name_path_and_tokenizer_errors(tiny_spec_dict, model, source_extra, message):
    tiny_spec_dict["data"]["source"] = {"kind": "file", "path": "t.csv", "label": "y", "classes": [0, 1],
                                        "text": "body", **source_extra}
    tiny_spec_dict["model"] = model
    with pytest.raises(specs.SpecError, match=message):
        specs.spec_from_dict(tiny_spec_dict)


def test_a_missing_model_folder_is_one_line_before_training(tiny_spec_dict, tmp_path):
    tiny_spec_dict["data"]["source"] = {"kind": "text", "name": "chatterbot"}
    tiny_spec_dict["model"] = {"kind": "hf", "path": str(tmp_path / "nowhere")}
    tiny_spec_dict["data"]["source"]["tokenizer"] = "minilm"
    with pytest.raises(specs.SpecError, match="data.source.tokenizer: 'minilm' is not the model's"):
        specs.spec_from_dict(tiny_spec_dict)
    del tiny_spec_dict["data"]["source"]["tokenizer"]
    spec = specs.spec_from_dict({**tiny_spec_dict, "data": {"declared_private_rows": 1000, "source": {"kind": "file", "path": "t.csv", "label": "y",
                                                                        "classes": [0, 1], "text": "b"}}})
    with pytest.raises(ValueError, match=r"^model.path: .*nowhere is not a folder"):
        builders.check_model(spec, 0, 2, 2**40)


def test_a_model_folder_missing_parts_is_refused_in_one_line(tmp_path, saved_minilm):
    import shutil

    for missing, message in (("config.json", "no config.json"), ("model.safetensors", "no weights"),
                             ("tokenizer.json", "no tokenizer")):
        folder = tmp_path / missing
        shutil.copytree(saved_minilm, folder)
        for name in [missing] + (["vocab.txt"] if missing == "tokenizer.json" else []):
            (folder / name).unlink(missing_ok=True)
        with pytest.raises(ValueError, match=f"^model.path: {message}"):
            pretrained.model_path(str(folder))


def test_a_tokenizer_written_like_the_model_path_is_the_models(tmp_path, tiny_spec_dict):
    import yaml

    tiny_spec_dict["data"]["source"] = {"kind": "file", "path": "t.csv", "label": "y", "classes": [0, 1],
                                        "text": "body", "tokenizer": "enc"}
    tiny_spec_dict["model"] = {"kind": "hf", "path": "enc"}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(tiny_spec_dict))
    spec = specs.load_spec(tmp_path / "s.yaml")
    assert spec.data.source.tokenizer == spec.model.path == str(tmp_path / "enc")
    tiny_spec_dict["data"]["source"]["text"] = "y"
    with pytest.raises(specs.SpecError, match="data.source.text: the label column cannot also be the text"):
        specs.spec_from_dict(tiny_spec_dict)


# ---------------------------------------------------------------- LoRA adapters (trainable: lora)
def test_lora_starts_as_the_pretrained_encoder_and_trains_only_adapters_and_head(hf_spec_dict, text_data):
    state = torch.random.get_rng_state()
    lora = _model(hf_spec_dict, text_data, trainable="lora", lora={"rank": 4, "alpha": 8.0})
    assert torch.equal(state, torch.random.get_rng_state())  # adapters drawn from the public generator only
    head_only = _model(hf_spec_dict, text_data, trainable="head")
    rows = torch.as_tensor(text_data.test.features[:6])
    with torch.inference_mode():  # B = 0: the adapted encoder computes the pretrained function
        torch.testing.assert_close(lora(rows), head_only(rows), rtol=0, atol=1e-6)
    chosen = {n for n, p in lora.named_parameters() if p.requires_grad}
    adapters = chosen - {"head.weight", "head.bias"}
    # query and value of 6 layers, an A and a B each
    assert len(adapters) == 6 * 2 * 2 and all(".lora_A." in n or ".lora_B." in n for n in adapters)
    assert sum(p.numel() for n, p in lora.named_parameters() if n in adapters) == 6 * 2 * 4 * (384 + 384)
    again = _model(hf_spec_dict, text_data, trainable="lora", lora={"rank": 4, "alpha": 8.0})
    a = {n: p for n, p in lora.named_parameters() if ".lora_A." in n}
    assert all(torch.equal(p, dict(again.named_parameters())[n]) for n, p in a.items())
    assert all(float(p.detach().abs().sum()) > 0 for p in a.values())


def test_a_lora_run_moves_the_adapters_and_the_head_and_nothing_else(hf_spec_dict, text_data):
    hf_spec_dict["model"] = {"kind": "hf", "name": "minilm", "trainable": "lora", "lora": {"rank": 2, "targets": ["value"]}}
    built, moved = _run(hf_spec_dict, text_data, 2)
    trainable = {n for n, p in built.model.named_parameters() if p.requires_grad}
    assert moved == trainable and len(trainable) == 2 + 6 * 2
    assert built.loop.backend.directions.dim == 21 * 384 + 21 + 6 * 2 * (384 + 384)


def test_dp_sgd_per_example_gradients_run_through_the_adapters(hf_spec_dict, text_data):
    from components.queries.clipped_sums import clipped_gradient_sum

    model = _model(hf_spec_dict, text_data, trainable="lora", lora={"rank": 2})
    params = models.trainable_parameters(model)
    x, y = torch.as_tensor(text_data.test.features[:3]), torch.as_tensor(text_data.test.labels[:3])
    got = clipped_gradient_sum(model, params, models.per_example_loss, x, y, 0.5)
    want = [torch.zeros(p.shape, dtype=torch.float64) for p in params]
    for i in range(3):
        grads = torch.autograd.grad(models.per_example_loss(model, x[i:i + 1], y[i:i + 1]).sum(), params)
        norm = float(torch.sqrt(sum(g.double().pow(2).sum() for g in grads)))
        for w, g in zip(want, grads):
            w += min(1.0, 0.5 / norm) * g.double()
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-7)
    assert any(float(g.abs().sum()) > 0 for g, p in zip(got, params) if p.shape[0] != 21)  # adapters' B moves


def test_lora_settings_are_checked_before_anything_runs(hf_spec_dict, text_data):
    hf_spec_dict["model"] = {"kind": "hf", "name": "minilm", "trainable": "bias", "lora": {"rank": 4}}
    with pytest.raises(specs.SpecError, match="lora: only used with trainable: lora"):
        specs.spec_from_dict(hf_spec_dict)
    hf_spec_dict["model"] = {"kind": "hf", "name": "minilm", "trainable": "lora"}
    spec = specs.spec_from_dict(hf_spec_dict)
    assert (spec.model.lora.rank, spec.model.lora.targets) == (8, ["query", "value"])  # written out
    hf_spec_dict["model"]["lora"] = {"targets": ["q_proj"]}
    spec = specs.spec_from_dict(hf_spec_dict)
    with pytest.raises(ValueError, match=r"^model.lora.targets: no Linear layer of the encoder is named 'q_proj'; "
                                         r"its Linear layers are named dense, key, query, value$"):
        builders.check_model(spec, text_data.n_features, text_data.n_classes, 2**40)
    with pytest.raises(ValueError, match="^model.lora.targets: no Linear layer"):
        builders.build_model(spec, text_data.n_features, text_data.n_classes)
    hf_spec_dict["model"]["lora"] = {"rank": 384}  # MiniLM's query and value are 384 x 384
    spec = specs.spec_from_dict(hf_spec_dict)
    with pytest.raises(ValueError, match=r"^model.lora.rank: 384 is not below the width 384 of the 'query' layers"):
        builders.check_model(spec, text_data.n_features, text_data.n_classes, 2**40)


@pytest.mark.parametrize("estimator", [{"kind": "two_point", "queries": 2}, {"kind": "first_order"}])
@pytest.mark.parametrize("mechanism", [{"kind": "gaussian", "clip": 1.0}, {"kind": "none"}])
def test_an_empty_poisson_batch_sums_to_zero_on_the_transformer(hf_spec_dict, text_data, estimator, mechanism):
    """A Poisson batch can be empty; the encoder cannot run on no rows, so the sums are zero without it."""
    hf_spec_dict["estimator"] = estimator
    hf_spec_dict["mechanism"] = mechanism
    if mechanism["kind"] == "none":
        hf_spec_dict.pop("privacy", None)
    spec = specs.spec_from_dict(hf_spec_dict)
    resolved, _, _ = builders.resolve_privacy(spec, len(text_data.private))
    built = builders.build_loop(resolved, text_data, noise_generator=private_generator(1),
                                sampling_generator=private_generator(2))
    built.loop.sampler.sample = lambda: torch.zeros(0, dtype=torch.long)
    before = [p.detach().clone() for p in models.trainable_parameters(built.model)]
    built.loop.run(1)
    assert built.loop.tracker.steps == 1
    if mechanism["kind"] == "none":  # nothing sampled, nothing released: the parameters stay
        assert all(torch.equal(a, b) for a, b in zip(before, models.trainable_parameters(built.model)))
