"""optimizer.kind adam: torch's AdamW on the released update, the same on every replica and after a resume."""
import copy
import io

import pytest
import torch

import specs
from components import builders, models
from components.directions import Directions
from components.queries import Update
from components.optimizers import Adam
from components.randomness import private_generator


def test_adam_is_adamw_on_the_update_assembled_from_seeds_and_dense_terms():
    p = torch.nn.Parameter(torch.randn(7, dtype=torch.float64))
    q = torch.nn.Parameter(torch.randn(3, 2, dtype=torch.float64))
    ref_p, ref_q = (torch.nn.Parameter(t.detach().clone()) for t in (p, q))
    d = Directions([p, q], "gaussian")
    opt = Adam(d, lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    ref = torch.optim.AdamW([ref_p, ref_q], lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    for step in range(5):
        dense = (torch.full((7,), 0.3, dtype=torch.float64), torch.ones(3, 2, dtype=torch.float64))
        opt.apply(Update(terms=((step, 0.5), (step + 100, -0.25)), dense=((dense, 2.0),)))
        ref_p.grad = 0.5 * d.tensor(step, 0) - 0.25 * d.tensor(step + 100, 0) + 2.0 * dense[0]
        ref_q.grad = 0.5 * d.tensor(step, 1) - 0.25 * d.tensor(step + 100, 1) + 2.0 * dense[1]
        ref.step()
    assert torch.equal(p.detach(), ref_p.detach()) and torch.equal(q.detach(), ref_q.detach())
    assert p.grad is None and q.grad is None  # nothing d-sized is left behind but the moments


def _built(tiny, estimator=None, **optimizer):
    d = copy.deepcopy(tiny)
    d["model"] = {"kind": "mlp", "hidden": [8]}
    d["optimizer"] = {"kind": "adam", "lr": 0.01, "steps": 60, **optimizer}
    if estimator:
        d["estimator"] = estimator
    spec = specs.spec_from_dict(d)
    data = builders.load_data(spec)
    resolved, _, _ = builders.resolve_privacy(spec, len(data.private))
    return resolved, data, builders.build_loop(resolved, data, noise_generator=private_generator(5),
                                               sampling_generator=private_generator(6))


def test_a_checkpointed_adam_state_continues_the_same_trajectory(tiny_spec_dict):
    _, _, whole = _built(tiny_spec_dict)
    whole.loop.run(6)
    _, _, first = _built(tiny_spec_dict)
    first.loop.run(3)
    buffer = io.BytesIO()
    torch.save(first.loop.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)  # how checkpoints are read back
    _, _, resumed = _built(tiny_spec_dict)
    resumed.loop.load_state_dict(saved, restore_privacy_steps=True)
    # the same private streams from where the first run stood (a test injects them; a private run's are fresh)
    resumed.loop.mechanism.use_generator(first.loop.mechanism._generator)
    resumed.loop.sampler.use_generator(first.loop.sampler._generator)
    resumed.loop.run(6)
    assert all(torch.equal(a, b) for a, b in zip(whole.model.parameters(), resumed.model.parameters()))


def test_dp_adam_learns_digits(tiny_spec_dict):
    tiny_spec_dict["mechanism"]["clip"] = 0.5
    resolved, data, built = _built(tiny_spec_dict, {"kind": "first_order"}, lr=0.01, steps=400)
    built.loop.run(resolved.optimizer.steps)
    accuracy = models.evaluate(built.model, torch.as_tensor(data.test.features), torch.as_tensor(data.test.labels))
    assert accuracy["accuracy"] > 0.8


@pytest.mark.parametrize("optimizer, message", [
    ({"kind": "adam", "lr": 0.01, "steps": 5, "betas": [0.9, 1.0]}, r"optimizer.betas: each must be in \[0, 1\)"),
    ({"kind": "adam", "lr": 0.01, "steps": 5, "betas": [0.9]}, "optimizer.betas"),
    ({"kind": "adam", "lr": 0.01, "steps": 5, "momentum": 0.9}, "optimizer.momentum"),
])
def test_bad_adam_settings_name_the_field(tiny_spec_dict, optimizer, message):
    tiny_spec_dict["optimizer"] = optimizer
    with pytest.raises(specs.SpecError, match=message):
        specs.spec_from_dict(tiny_spec_dict)


def test_pazo_s_needs_plain_sgd(tiny_spec_dict):
    tiny_spec_dict["estimator"] = {"kind": "pazo_s", "public_batches": 2, "public_batch_size": 8}
    tiny_spec_dict["optimizer"] = {"kind": "adam", "lr": 0.01, "steps": 5}
    with pytest.raises(specs.SpecError, match="optimizer.kind: pazo_s steps to the candidate it scored"):
        specs.spec_from_dict(tiny_spec_dict)


def test_a_kept_adam_state_is_a_snapshot(tiny_spec_dict):
    """A retried chunk rewinds to a checkpoint held in memory: later steps must not change it."""
    _, _, built = _built(tiny_spec_dict)
    built.loop.run(3)
    saved = built.loop.state_dict()
    moments = [v["exp_avg"].clone() for v in saved["optimizer"]["adam"]["state"].values()]
    built.loop.run(6)
    state = saved["optimizer"]["adam"]["state"]
    assert all(float(v["step"]) == 3.0 for v in state.values())
    assert all(torch.equal(v["exp_avg"], m) for v, m in zip(state.values(), moments))


@pytest.mark.parametrize("sgd, field", [({"momentum": 0.9}, "optimizer.momentum"),
                                        ({"weight_decay": 0.01}, "optimizer.weight_decay")])
def test_pazo_s_refuses_momentum_and_weight_decay_too(tiny_spec_dict, sgd, field):
    tiny_spec_dict["estimator"] = {"kind": "pazo_s", "public_batches": 2, "public_batch_size": 8}
    tiny_spec_dict["optimizer"].update(sgd)
    with pytest.raises(specs.SpecError, match=f"{field}: pazo_s steps to the candidate it scored"):
        specs.spec_from_dict(tiny_spec_dict)
