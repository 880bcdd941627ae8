"""The private loop as a whole: reproducibility matrix, replay, accounting of executed steps."""
import dp_accounting
import pytest
import torch
from dp_accounting import rdp

import specs
from components import builders, models
from components.directions import Directions
from components.optimizers import Sgd, replay
from components.randomness import private_generator
from components.queries import Update


def _built(tiny, noise_seed=None, sampling_seed=None, **privacy):
    tiny["privacy"].update(privacy)
    spec = specs.spec_from_dict(tiny)
    data = builders.load_data(spec)
    resolved = spec.resolved(n_private=len(data.private), noise_multiplier=builders.calibrate_noise(spec, len(data.private)))
    kwargs = {}
    if noise_seed is not None:
        kwargs = {"noise_generator": private_generator(noise_seed), "sampling_generator": private_generator(sampling_seed)}
    return resolved, data, builders.build_loop(resolved, data, **kwargs)


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def test_injected_generators_reproduce_the_trajectory(tiny_spec_dict):
    _, _, a = _built(dict(tiny_spec_dict), 1, 2)
    _, _, b = _built(dict(tiny_spec_dict), 1, 2)
    a.loop.run(30)
    b.loop.run(30)
    assert all(torch.equal(x, y) for x, y in zip(_params(a.model), _params(b.model)))
    assert a.loop.journal == b.loop.journal


def test_same_public_seed_different_private_noise(tiny_spec_dict):
    """Directions are public (same seeds in both runs); noise and batches are not."""
    _, _, a = _built(dict(tiny_spec_dict))
    _, _, b = _built(dict(tiny_spec_dict))
    a.loop.run(5)
    b.loop.run(5)
    assert [e.seed for e in a.loop.journal] == [e.seed for e in b.loop.journal]
    assert [e.coefficient for e in a.loop.journal] != [e.coefficient for e in b.loop.journal]


def test_insecure_deterministic_is_repeatable(tiny_spec_dict):
    import copy

    _, _, a = _built(copy.deepcopy(tiny_spec_dict), insecure_deterministic=True)
    _, _, b = _built(copy.deepcopy(tiny_spec_dict), insecure_deterministic=True)
    a.loop.run(10)
    b.loop.run(10)
    assert a.loop.journal == b.loop.journal


def test_journal_replays_to_the_same_parameters(tiny_spec_dict):
    resolved, data, built = _built(dict(tiny_spec_dict), 3, 4)
    x0 = _params(built.model)
    built.loop.run(40)
    # replayed on the device that trained (a GPU's direction streams are not the CPU's)
    fresh = builders.build_model(resolved, data.n_features, data.n_classes).to(built.device)
    assert all(torch.equal(x, y) for x, y in zip(x0, _params(fresh)))  # init is public and seeded
    replay(Directions(list(fresh.parameters()), resolved.estimator.directions), built.loop.journal,
           resolved.optimizer.lr)
    assert all(torch.equal(x, y) for x, y in zip(_params(built.model), _params(fresh)))


def test_tracker_counts_executed_steps_and_matches_dp_accounting(tiny_spec_dict):
    resolved, data, built = _built(dict(tiny_spec_dict))
    built.loop.run(25)
    rate = resolved.sampling.expected_batch_size / len(data.private)
    ref = rdp.RdpAccountant().compose(
        dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(resolved.mechanism.noise_multiplier)), 25)
    assert built.loop.tracker.steps == 25
    assert built.loop.tracker.epsilon() == pytest.approx(ref.get_epsilon(resolved.privacy.delta), rel=1e-12)


def test_training_improves_test_accuracy(tiny_spec_dict):
    tiny_spec_dict["optimizer"]["steps"] = 400
    _, data, built = _built(tiny_spec_dict, 5, 6)
    x, y = torch.as_tensor(data.test.features, device=built.device), torch.as_tensor(data.test.labels, device=built.device)
    before = models.evaluate(built.model, x, y)["accuracy"]
    built.loop.run(400)
    assert models.evaluate(built.model, x, y)["accuracy"] > max(0.3, before + 0.15)


def test_sgd_momentum_and_weight_decay_match_dense_reference():
    p = torch.nn.Parameter(torch.randn(5, dtype=torch.float64))
    ref = p.detach().clone()
    d = Directions([p], "gaussian")
    opt = Sgd(d, lr=0.1, momentum=0.9, weight_decay=0.01)
    v = torch.zeros(5, dtype=torch.float64)
    for step in range(4):
        update = Update(terms=((step, 0.5), (step + 100, -0.25)))
        opt.apply(update)
        g = 0.5 * d.tensor(step, 0) - 0.25 * d.tensor(step + 100, 0) + 0.01 * ref
        v = 0.9 * v + g
        ref = ref - 0.1 * v
    assert torch.allclose(p.detach(), ref, atol=1e-12)


@pytest.mark.parametrize("model", [{"kind": "linear"}, {"kind": "mlp", "hidden": [16]}, {"kind": "cnn", "channels": [4, 8]}])
def test_model_init_is_public_and_leaves_the_global_rng_alone(tiny_spec_dict, model):
    tiny_spec_dict["model"] = model
    spec = specs.spec_from_dict(tiny_spec_dict)
    state = torch.random.get_rng_state()
    a = builders.build_model(spec, 64, 10)
    assert torch.equal(state, torch.random.get_rng_state())
    b = builders.build_model(spec, 64, 10)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    other = dict(tiny_spec_dict, seed=tiny_spec_dict["seed"] + 1)
    c = builders.build_model(specs.spec_from_dict(other), 64, 10)
    assert not torch.equal(next(a.parameters()), next(c.parameters()))
