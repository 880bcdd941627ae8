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
        "name": "t", "seed": 3, "data": {"source": {"kind": "text", "name": "chatterbot", "max_length": 16},
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


@pytest.mark.parametrize("trainable, tensors", [("head", 2), ("bias", 2 + 1 + 6 * 8), ("all", 2 + 101)])
def test_trainable_chooses_what_requires_grad(hf_spec_dict, text_data, trainable, tensors):
    model = _model(hf_spec_dict, text_data, trainable=trainable)
    params = dict(model.named_parameters())
    chosen = {n for n, p in params.items() if p.requires_grad}
    assert len(chosen) == tensors and {"head.weight", "head.bias"} <= chosen
    if trainable == "bias":
        assert all(n.endswith("bias") for n in chosen - {"head.weight"})
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
