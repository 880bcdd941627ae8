"""GEP (estimator gep): the anchor subspace, the clipped embedding and residual sums against a one-example-
at-a-time reference, the noise of each part, the exactness of its single-Gaussian accounting, and a whole
step written out by hand."""
import math

import pytest
import torch
from scipy import stats

import specs
from components import builders, models
from components.data import PoissonSampler
from components.estimators import anchor_basis
from components.queries.clipped_sums import clipped_gradient_sum, embedded_gradient_sums, per_example_gradient_matrix
from components.mechanisms import GaussianMechanism
from components.models import per_example_loss
from components.randomness import private_generator


def _digits(n=12, start=0):
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return (torch.as_tensor(x[start:start + n] / 16.0, dtype=torch.float32), torch.as_tensor(y[start:start + n]))


def _flat_grads(model, params, x, y):
    rows = []
    for i in range(len(y)):
        grads = torch.autograd.grad(per_example_loss(model, x[i:i + 1], y[i:i + 1]).sum(), params, allow_unused=True)
        rows.append(torch.cat([(torch.zeros_like(p) if g is None else g).flatten() for p, g in zip(params, grads)]))
    return torch.stack(rows).double()


def _reference(model, params, x, y, basis, clip, residual_clip):
    """Each example on its own: backprop, split by the basis, clip each part, add up (float64)."""
    b = basis.double()
    w_sum = torch.zeros(b.shape[0], dtype=torch.float64)
    r_sum = torch.zeros(b.shape[1], dtype=torch.float64)
    for g in _flat_grads(model, params, x, y):
        w = b @ g
        r = g - b.T @ w
        w_sum += w * min(1.0, clip / float(w.norm()))
        r_sum += r * min(1.0, residual_clip / float(r.norm()))
    return w_sum, r_sum


def test_anchor_basis_is_the_top_k_right_singular_subspace():
    torch.manual_seed(0)
    anchors = torch.randn(12, 300, dtype=torch.float64) * torch.linspace(3.0, 0.1, 300)
    basis = anchor_basis(anchors, 5)
    assert basis.shape == (5, 300)
    assert torch.allclose(basis @ basis.T, torch.eye(5, dtype=torch.float64), atol=1e-10)
    # what the basis leaves out of the anchors is exactly the energy of the other singular values
    s = torch.linalg.svdvals(anchors)
    residual = anchors - anchors @ basis.T @ basis
    assert float(residual.pow(2).sum()) == pytest.approx(float(s[5:].pow(2).sum()), rel=1e-9)
    with pytest.raises(ValueError, match="estimator.anchors: need 1 <= k <= 12"):
        anchor_basis(anchors, 13)
    # rank 2 anchors asked for 4 directions: the two it has, and two zero rows
    low = torch.randn(12, 2, dtype=torch.float64) @ torch.randn(2, 300, dtype=torch.float64)
    basis = anchor_basis(low, 4)
    assert torch.allclose(basis[:2] @ basis[:2].T, torch.eye(2, dtype=torch.float64), atol=1e-8)
    assert float(basis[2:].abs().max()) == 0.0
    assert torch.allclose(low - low @ basis.T @ basis, torch.zeros_like(low), atol=1e-8)
    # float32 anchors (a model's gradients) give a float32 basis, orthonormal to float32 precision
    single = anchor_basis(anchors.float(), 5)
    assert single.dtype == torch.float32
    assert torch.allclose(single @ single.T, torch.eye(5), atol=1e-4)


def test_public_anchor_gradients_are_per_example():
    model = models.mlp(64, 10, [8], "tanh")
    params = models.trainable_parameters(model)
    x, y = _digits(6)
    assert torch.allclose(per_example_gradient_matrix(model, params, per_example_loss, x, y).double(),
                          _flat_grads(model, params, x, y), atol=1e-6)


@pytest.mark.parametrize("clip, residual_clip", [(0.05, 0.02), (0.3, 1.0), (10.0, 10.0)])
def test_clipped_sums_match_one_example_at_a_time(clip, residual_clip):
    torch.manual_seed(1)
    model = models.mlp(64, 10, [16], "tanh")
    params = models.trainable_parameters(model)
    x, y = _digits(12)
    public_x, public_y = _digits(8, start=100)
    basis = anchor_basis(per_example_gradient_matrix(model, params, per_example_loss, public_x, public_y), 4)
    w_sum, r_sum = embedded_gradient_sums(model, params, per_example_loss, x, y, basis, clip, residual_clip)
    want_w, want_r = _reference(model, params, x, y, basis, clip, residual_clip)
    assert torch.allclose(w_sum, want_w, atol=1e-6)
    assert torch.allclose(torch.cat([t.flatten() for t in r_sum]), want_r, atol=1e-6)
    # without clipping the two parts add up to the plain gradient sum
    w_all, r_all = embedded_gradient_sums(model, params, per_example_loss, x, y, basis, math.inf, math.inf)
    plain = torch.cat([t.flatten() for t in clipped_gradient_sum(model, params, per_example_loss, x, y, math.inf)])
    assert torch.allclose(basis.double().T @ w_all + torch.cat([t.flatten() for t in r_all]), plain, atol=1e-6)


def test_an_example_with_a_non_finite_gradient_contributes_nothing():
    model = models.linear(64, 10)
    params = models.trainable_parameters(model)
    x, y = _digits(6)
    basis = anchor_basis(per_example_gradient_matrix(model, params, per_example_loss, *_digits(8, start=50)), 3)
    clean_w, clean_r = embedded_gradient_sums(model, params, per_example_loss, x[1:], y[1:], basis, 0.5, 0.5)
    x[0, 3] = float("inf")
    w, r = embedded_gradient_sums(model, params, per_example_loss, x, y, basis, 0.5, 0.5)
    assert torch.isfinite(w).all() and all(torch.isfinite(t).all() for t in r)
    # float32 sums over 5 and 6 rows round differently (BLAS blocks by batch size, and by CPU): equal to
    # float32 rounding of the clipped sums, far below what one clipped example (norm 0.5) would move them
    assert torch.allclose(w, clean_w, rtol=1e-5, atol=1e-6)
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(r, clean_r))


@pytest.mark.parametrize("neighboring", ["add_remove", "replace_one"])
@pytest.mark.parametrize("share, residual_clip", [(0.5, 0.5), (0.2, 2.0)])
def test_each_part_gets_its_stated_noise_and_together_they_are_one_gaussian(neighboring, share, residual_clip):
    """Embedding noise std sigma Delta_1 / sqrt(s), residual std sigma Delta_2 / sqrt(1 - s); one example
    moves the pair by at most Delta_1 and Delta_2 in L2, so in units of their noise by at most
    sqrt(s + (1 - s)) / sigma = 1 / sigma: exactly the Gaussian(sigma) the step's event states."""
    sigma, clip = 0.8, 0.5
    mech = GaussianMechanism(clip, sigma, 1, neighboring, private_generator(3))
    scale = 2.0 if neighboring == "replace_one" else 1.0
    e_std = sigma * scale * clip / math.sqrt(share)
    r_std = sigma * scale * residual_clip / math.sqrt(1 - share)
    embedding = torch.zeros(4000, dtype=torch.float64)
    residual = [torch.zeros(50, 80), torch.zeros(1000)]
    e_out, r_out = mech.release_embedded(embedding, residual, residual_clip, share)
    for noise, std in ((e_out, e_std), (torch.cat([t.double().flatten() for t in r_out]), r_std)):
        z = (noise / std).numpy()
        assert stats.kstest(z, "norm").pvalue > 1e-4
        lo, hi = stats.chi2.ppf([1e-5, 1 - 1e-5], len(z)) / len(z)
        assert lo < float((z ** 2).mean()) < hi
    normalised_sensitivity = math.sqrt((scale * clip / e_std) ** 2 + (scale * residual_clip / r_std) ** 2)
    assert normalised_sensitivity == pytest.approx(1 / sigma)
    assert mech.step_event().noise_multiplier == sigma


def test_a_step_is_the_embedded_and_residual_release_over_the_expected_batch(tiny_spec_dict):
    """x_1 = x_0 - lr (B^T w~ + r~) / b, with the public anchors, the batch and both noises redrawn by hand."""
    from tests.components.test_first_order import built_for_a_hand_step

    resolved, data, built, params, before = built_for_a_hand_step(
        tiny_spec_dict, {"kind": "gep", "anchors": 4, "public_batch_size": 8, "residual_clip": 0.1})
    (public_idx,) = built.loop.public.batches(0, 1, 8)
    px, py = torch.as_tensor(data.public.features), torch.as_tensor(data.public.labels)
    basis = anchor_basis(_flat_grads(built.model, params, px[public_idx], py[public_idx]).float(), 4)
    x, y = torch.as_tensor(data.private.features), torch.as_tensor(data.private.labels)
    idx = PoissonSampler(len(y), 64, resolved.public_rows(), private_generator(8)).sample()  # rate 64 / declared rows
    w_sum, r_sum = _reference(built.model, params, x[idx], y[idx], basis, 0.2, 0.1)
    gen = private_generator(7)
    w_noisy = w_sum + 0.9 * 0.2 / math.sqrt(0.5) * torch.randn(4, generator=gen, dtype=torch.float64)
    r_noise = torch.cat([torch.randn(p.shape, generator=gen, dtype=torch.float64).flatten() for p in params])
    r_noisy = r_sum + 0.9 * 0.1 / math.sqrt(0.5) * r_noise
    update = basis.double().T @ w_noisy + r_noisy

    built.loop.run(1)
    got = torch.cat([(b.double() - p.detach().double()).flatten() for p, b in zip(params, before)])
    assert torch.allclose(got, resolved.optimizer.lr * update / 64, atol=1e-5)
    assert built.loop.tracker.steps == 1 and built.loop.released == []


def test_without_a_mechanism_gep_steps_along_the_plain_gradient(tiny_spec_dict):
    """Nothing clipped or noised: embedding and residual add back up to the gradient, so a non-private GEP
    step is a non-private first-order step on the same batch."""
    tiny_spec_dict.pop("privacy")
    tiny_spec_dict["mechanism"] = {"kind": "none"}
    tiny_spec_dict["model"] = {"kind": "mlp", "hidden": [8]}
    runs = []
    for estimator in ({"kind": "gep", "anchors": 3, "public_batch_size": 8}, {"kind": "first_order"}):
        tiny_spec_dict["estimator"] = estimator
        spec = specs.spec_from_dict(tiny_spec_dict)
        data = builders.load_data(spec)
        built = builders.build_loop(spec.resolved(n_private=len(data.private), noise_multiplier=None), data,
                                    sampling_generator=private_generator(5))
        built.loop.run(2)
        runs.append(torch.cat([p.detach().flatten() for p in built.model.parameters()]))
    assert torch.allclose(runs[0], runs[1], atol=1e-5)


def test_spec_rules(tiny_spec_dict):
    tiny_spec_dict["estimator"] = {"kind": "gep", "anchors": 40, "public_batch_size": 32}
    with pytest.raises(specs.SpecError, match=r"anchors \(40\) cannot exceed public_batch_size \(32\)"):
        specs.spec_from_dict(tiny_spec_dict)
    tiny_spec_dict["estimator"] = {"kind": "gep", "embedding_share": 1.0}
    with pytest.raises(specs.SpecError, match="estimator.embedding_share"):
        specs.spec_from_dict(tiny_spec_dict)
    tiny_spec_dict["estimator"] = {"kind": "gep"}
    tiny_spec_dict["execution"] = {"prefetch_directions": True}
    with pytest.raises(specs.SpecError, match="prefetch_directions: gep has no seeded directions"):
        specs.spec_from_dict(tiny_spec_dict)
    tiny_spec_dict["execution"] = {}
    tiny_spec_dict["data"]["split"] = {"kind": "fraction", "public": 0.0, "test": 0.2}
    with pytest.raises(specs.SpecError, match="estimator.kind: gep uses public data; set data.split.public > 0"):
        specs.spec_from_dict(tiny_spec_dict)  # refused when validated, before any data is read


def test_the_residual_clip_is_resolved_logged_and_reported(tiny_spec_dict):
    """The residual clip bounds each example as the clip does: the resolved spec (what a run logs) holds it
    as a number, and the privacy report states both clips."""
    from flows.record.reporting import privacy_report, summarize

    tiny_spec_dict["estimator"] = {"kind": "gep", "anchors": 4, "public_batch_size": 8}
    spec = specs.spec_from_dict(tiny_spec_dict)
    resolved, _, _ = builders.resolve_privacy(spec, 1000)
    assert resolved.estimator.residual_clip == resolved.mechanism.clip == 2.0
    assert specs.flatten(resolved)["estimator.residual_clip"] == "2.0"
    report = privacy_report(summarize(resolved, 1.0, 10, builders.spec_sampler(resolved, 1000), 1), {})
    assert "| clip C (gep: of the embedding) | 2 |" in report and "| residual clip C2 (gep) | 2 |" in report


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 1e30])
def test_non_finite_anchors_fail_in_one_line_before_any_release(value):
    """NaN, either infinity, or an entry whose square overflows float32 (its Gram matrix would be inf)."""
    anchors = torch.randn(8, 50)
    anchors[3, 7] = value
    with pytest.raises(FloatingPointError, match="^estimator gep: the public anchor gradients are not finite"):
        anchor_basis(anchors, 4)
