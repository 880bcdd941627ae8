"""DOPE-SGD and PDA-DPMD (estimators dope_sgd, pda_dpmd): the centred clipped sum against a one-example-at-a-
time reference, each update written out by hand from a real step, the private weight's schedule, their
accounting (DP-SGD's, exactly), and the refusals. The sensitivity and noise tests they share with every
estimator are in test_estimator_contract."""
import copy
import math

import pytest
import torch

import specs
from components import builders, models
from components.estimators import DopeSgdEstimator, PdaDpmdEstimator
from components.queries.clipped_sums import clipped_gradient_sum
from components.models import per_example_loss
from components.randomness import private_generator
from tests.components.test_gep import _digits, _flat_grads


@pytest.mark.parametrize("clip", [0.05, 0.5, 50.0])
def test_centred_clipped_sum_matches_one_example_at_a_time(clip):
    torch.manual_seed(1)
    model = models.mlp(64, 10, [8], "tanh")
    params = models.trainable_parameters(model)
    x, y = _digits(10)
    center = tuple(torch.randn_like(p) * 0.05 for p in params)
    flat_center = torch.cat([c.flatten() for c in center]).double()
    expected = torch.zeros_like(flat_center)
    for g in _flat_grads(model, params, x, y):
        v = g - flat_center
        expected += v * min(1.0, clip / float(v.norm()))
    got = torch.cat([t.flatten() for t in clipped_gradient_sum(model, params, per_example_loss, x, y, clip, center)])
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-7)
    # no mechanism: nothing clipped, the plain summed gradient less the center once per row
    plain = torch.cat([t.flatten() for t in clipped_gradient_sum(model, params, per_example_loss, x, y, math.inf,
                                                                 center)])
    assert torch.allclose(plain, _flat_grads(model, params, x, y).sum(0) - len(y) * flat_center, atol=1e-5)


def test_a_private_gradient_at_the_center_is_not_clipped():
    """The point of DOPE-SGD: clipping around the public gradient leaves a private gradient that agrees
    with it untouched, where DP-SGD's clip (around 0) shrinks it to C."""
    model = models.mlp(64, 10, [8], "tanh")
    params = models.trainable_parameters(model)
    x, y = _digits(1)
    (g,) = _flat_grads(model, params, x, y)
    sizes = [p.numel() for p in params]
    center = tuple(t.view_as(p).float() for t, p in zip(torch.split(g, sizes), params))
    clip = 1e-3 * float(g.norm())
    centred = torch.cat([t.flatten() for t in clipped_gradient_sum(model, params, per_example_loss, x, y, clip, center)])
    assert float(centred.norm()) < 1e-5 * float(g.norm())  # g - center is ~0: nothing left to clip
    plain = torch.cat([t.flatten() for t in clipped_gradient_sum(model, params, per_example_loss, x, y, clip)])
    assert float(plain.norm()) == pytest.approx(clip, rel=1e-6)


def _spec(tiny, kind, **estimator):
    tiny = copy.deepcopy(tiny)
    tiny["estimator"] = {"kind": kind, "public_batch_size": 8, **estimator}
    tiny["model"] = {"kind": "mlp", "hidden": [8]}
    tiny["mechanism"]["clip"] = 0.5
    return specs.spec_from_dict(tiny)


class _Capture:
    """Wraps the mechanism: keeps each released vector, so a step's update can be rebuilt by hand."""

    def __init__(self, inner):
        self.inner, self.released = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def release_vector(self, tensors):
        out = self.inner.release_vector(tensors)
        self.released.append([t.clone() for t in out])
        return out


@pytest.mark.parametrize("kind", ["dope_sgd", "pda_dpmd"])
def test_a_step_is_the_written_out_update(tiny_spec_dict, kind):
    spec = _spec(tiny_spec_dict, kind)
    data = builders.load_data(spec)
    resolved, _, _ = builders.resolve_privacy(spec, len(data.private))
    built = builders.build_loop(resolved, data, noise_generator=private_generator(3),
                                sampling_generator=private_generator(4))
    loop = built.loop
    capture = _Capture(loop.mechanism)
    loop.mechanism = capture
    params = loop.backend.directions.params
    lr, b, steps = resolved.optimizer.lr, resolved.sampling.expected_batch_size, resolved.optimizer.steps
    for step in range(3):
        before = [p.detach().clone() for p in params]
        (batch,) = loop.public.batches(step, 1, 8)
        public = loop.public.gradient(batch)  # the step's public gradient, at x_t, from the public seed
        loop.run(step + 1)
        noisy = capture.released[-1]
        if kind == "dope_sgd":
            update = [n.double() / b + p.double() for n, p in zip(noisy, public)]
        else:
            a = math.cos(math.pi * step / (2 * steps))
            update = [a * n.double() / b + (1 - a) * p.double() for n, p in zip(noisy, public)]
        for p, p0, u in zip(params, before, update):
            assert torch.allclose(p.detach().double(), p0.double() - lr * u, atol=1e-6)
    assert len(capture.released) == 3  # one d-dimensional release a step


def test_pda_dpmd_weight_moves_from_private_to_public():
    est = PdaDpmdEstimator(public_batch_size=4, total_steps=100)
    weights = [est.private_weight(t) for t in range(100)]
    assert weights[0] == 1.0 and weights[50] == pytest.approx(math.cos(math.pi / 4))
    assert all(a > b for a, b in zip(weights, weights[1:])) and 0 < weights[-1] < 0.02
    assert est.private_weight(150) == pytest.approx(0.0, abs=1e-15)  # past the plan (a resumed extra step)
    with pytest.raises(ValueError, match="planned steps"):
        PdaDpmdEstimator(public_batch_size=4, total_steps=0)
    with pytest.raises(ValueError, match="public_batch_size"):
        DopeSgdEstimator(public_batch_size=0)


@pytest.mark.parametrize("kind", ["dope_sgd", "pda_dpmd"])
def test_accounting_is_dp_sgds(tiny_spec_dict, kind):
    """The same noise multiplier, steps and event as first_order for the same budget: one Poisson-sampled
    Gaussian of sensitivity C a step; the public gradient is post-processing."""
    spec = _spec(tiny_spec_dict, kind)
    reference = copy.deepcopy(tiny_spec_dict)
    reference["estimator"] = {"kind": "first_order"}
    reference["model"] = {"kind": "mlp", "hidden": [8]}
    reference["mechanism"]["clip"] = 0.5
    reference = specs.spec_from_dict(reference)
    mine, rate, eps = builders.resolve_privacy(spec, 1385)
    theirs, rate_ref, eps_ref = builders.resolve_privacy(reference, 1385)
    assert mine.mechanism.noise_multiplier == theirs.mechanism.noise_multiplier
    assert (rate, eps, mine.optimizer.steps) == (rate_ref, eps_ref, theirs.optimizer.steps)
    assert builders.planned_event(mine, 1385, mine.mechanism.noise_multiplier) == \
        builders.planned_event(theirs, 1385, theirs.mechanism.noise_multiplier)


@pytest.mark.parametrize("kind", ["dope_sgd", "pda_dpmd"])
def test_without_public_data_is_refused_in_one_line(tiny_spec_dict, kind):
    tiny = copy.deepcopy(tiny_spec_dict)
    tiny["data"]["split"]["public"] = 0.0
    tiny["data"]["split"].pop("imbalance")
    tiny["estimator"] = {"kind": kind}
    with pytest.raises(specs.SpecError, match=f"estimator.kind: {kind} uses public data"):
        specs.spec_from_dict(tiny)
