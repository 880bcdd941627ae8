"""DP-SGD (estimator first_order): the clipped per-example gradient sum against a one-example-at-a-time
reference, on every model kind, and its step against the algorithm written out by hand."""
import math

import pytest
import torch

import specs
from components import builders, models
from components.data import PoissonSampler
from components.queries import clipped_sums as evaluate_module
from components.queries.clipped_sums import clipped_gradient_sum
from components.models import per_example_loss
from components.randomness import private_generator


def _reference(model, params, x, y, clip):
    """Each example on its own: backprop, clip its whole gradient to L2 norm ``clip``, add up (float64)."""
    total = [torch.zeros(p.shape, dtype=torch.float64) for p in params]
    for i in range(len(y)):
        loss = per_example_loss(model, x[i:i + 1], y[i:i + 1]).sum()
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]
        norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))
        factor = 1.0 if math.isinf(clip) else min(1.0, clip / norm)
        for t, g in zip(total, grads):
            t += factor * g.double()
    return total


def _digits(n=12):
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return torch.as_tensor(x[:n] / 16.0, dtype=torch.float32), torch.as_tensor(y[:n])


def _assert_close(got, want, tol=1e-6):
    for g, w in zip(got, want):
        assert g.dtype == torch.float64 and g.shape == w.shape
        assert float((g - w).abs().max()) <= tol * max(1.0, float(w.abs().max()))


@pytest.mark.parametrize("make", [
    lambda: models.linear(64, 10),
    lambda: models.mlp(64, 10, [16, 8], "tanh"),
    lambda: models.cnn(64, 10, [4, 6]),
], ids=["linear", "mlp", "cnn"])
@pytest.mark.parametrize("clip", [0.05, 1.0, math.inf])
def test_clipped_sum_matches_one_example_at_a_time(make, clip):
    torch.manual_seed(0)
    model = make().eval()
    params = models.trainable_parameters(model)
    x, y = _digits()
    _assert_close(clipped_gradient_sum(model, params, per_example_loss, x, y, clip),
                  _reference(model, params, x, y, clip))


def test_chunks_do_not_change_the_sum(monkeypatch):
    torch.manual_seed(1)
    model = models.mlp(64, 10, [16]).eval()
    params = models.trainable_parameters(model)
    x, y = _digits(20)
    whole = clipped_gradient_sum(model, params, per_example_loss, x, y, 0.3)
    row_bytes = sum(p.numel() * p.element_size() for p in params)
    monkeypatch.setattr(evaluate_module, "PER_EXAMPLE_GRADIENT_BYTES", 3 * row_bytes)  # chunks of 3 rows
    _assert_close(clipped_gradient_sum(model, params, per_example_loss, x, y, 0.3), whole)  # float32 rounding


def test_each_example_moves_the_sum_by_at_most_the_clip():
    torch.manual_seed(2)
    model = models.mlp(64, 10, [16]).eval()
    params = models.trainable_parameters(model)
    x, y = _digits(16)
    x = x * 50.0  # large inputs: every per-example gradient is far above the clip
    clip = 0.1
    full = clipped_gradient_sum(model, params, per_example_loss, x, y, clip)
    for i in range(len(y)):
        keep = torch.arange(len(y)) != i
        without = clipped_gradient_sum(model, params, per_example_loss, x[keep], y[keep], clip)
        moved = math.sqrt(sum(float((a - b).pow(2).sum()) for a, b in zip(full, without)))
        assert clip * 0.999 <= moved <= clip * (1 + 1e-6)


def test_an_example_with_a_non_finite_gradient_contributes_nothing():
    torch.manual_seed(3)
    model = models.linear(64, 10).eval()
    params = models.trainable_parameters(model)
    x, y = _digits(6)
    poisoned = x.clone()
    poisoned[2, 5] = float("inf")
    got = clipped_gradient_sum(model, params, per_example_loss, poisoned, y, 0.5)
    keep = torch.arange(6) != 2
    want = clipped_gradient_sum(model, params, per_example_loss, x[keep], y[keep], 0.5)
    assert all(torch.isfinite(g).all() for g in got)
    _assert_close(got, want)


def test_frozen_parameters_get_no_gradient_and_the_transformer_matches_the_reference():
    """MiniLM with only biases trainable: torch.func runs through the encoder (a prepared attention mask
    keeps it free of data-dependent branches) and agrees with backprop one row at a time."""
    gen = torch.Generator().manual_seed(0)
    model = models.text_classifier("minilm", 4, "bias", gen).eval()
    params = models.trainable_parameters(model)
    ids = torch.randint(1000, 5000, (3, 10), generator=gen)
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[0, 6:] = 0  # one padded row, two full ones
    x, y = torch.stack([ids, mask], dim=1), torch.tensor([0, 3, 1])
    _assert_close(clipped_gradient_sum(model, params, per_example_loss, x, y, 0.5),
                  _reference(model, params, x, y, 0.5), tol=1e-5)


def test_the_prepared_attention_mask_gives_the_encoders_own_output():
    gen = torch.Generator().manual_seed(0)
    model = models.text_classifier("minilm", 4, "head", gen).eval()
    ids = torch.randint(1000, 5000, (3, 10), generator=gen)
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[1, 4:] = 0
    with torch.no_grad():
        hidden = model.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        weights = mask.unsqueeze(-1).float()
        want = model.head((hidden * weights).sum(1) / weights.sum(1))
        got = model(torch.stack([ids, mask], dim=1))
    assert float((got - want).abs().max()) <= 1e-5


def built_for_a_hand_step(tiny, estimator, clip=0.2, sigma=0.9):
    """A small MLP run of ``estimator`` whose noise and batches come from generators seeded 7 and 8, for a
    step redrawn by hand: (resolved spec, data, built loop, trainable parameters, their values before)."""
    tiny["estimator"] = estimator
    tiny["model"] = {"kind": "mlp", "hidden": [8]}
    tiny["mechanism"]["clip"] = clip
    spec = specs.spec_from_dict(tiny)
    data = builders.load_data(spec)
    resolved = spec.resolved(n_private=len(data.private), noise_multiplier=sigma)
    built = builders.build_loop(resolved, data, noise_generator=private_generator(7),
                                sampling_generator=private_generator(8))
    params = list(built.loop.backend.directions.params)
    return resolved, data, built, params, [p.detach().clone() for p in params]


def test_a_step_is_the_clipped_sum_plus_noise_over_the_expected_batch(tiny_spec_dict):
    """x_1 = x_0 - lr * (sum_i clip(g_i) + N(0, sigma^2 C^2 I)) / b, with the same batch and noise drawn
    by hand from the injected generators."""
    resolved, data, built, params, before = built_for_a_hand_step(tiny_spec_dict, {"kind": "first_order"})
    x = torch.as_tensor(data.private.features)
    y = torch.as_tensor(data.private.labels)
    sampler = PoissonSampler(len(y), 64, resolved.public_rows(), private_generator(8))  # rate 64 / declared rows
    idx = sampler.sample()
    expected_sum = _reference(built.model, params, x[idx], y[idx], 0.2)
    noise_gen = private_generator(7)
    noisy = [s + 0.9 * 0.2 * torch.randn(s.shape, generator=noise_gen, dtype=torch.float64) for s in expected_sum]

    built.loop.run(1)
    lr = resolved.optimizer.lr
    for p, b, n in zip(params, before, noisy):
        want = b.double() - lr * n / 64
        assert float((p.detach().double() - want).abs().max()) <= 1e-5
    assert built.loop.tracker.steps == 1
    assert built.loop.released == []  # nothing scalar is released; the noisy vector is the update


def test_spec_rejects_prefetch_and_direction_options(tiny_spec_dict):
    tiny_spec_dict["estimator"] = {"kind": "first_order"}
    tiny_spec_dict["execution"] = {"prefetch_directions": True}
    with pytest.raises(specs.SpecError, match="prefetch_directions: first_order has no seeded directions"):
        specs.spec_from_dict(tiny_spec_dict)
    tiny_spec_dict["execution"] = {}
    tiny_spec_dict["estimator"] = {"kind": "first_order", "queries": 2}
    with pytest.raises(specs.SpecError, match="queries"):
        specs.spec_from_dict(tiny_spec_dict)
