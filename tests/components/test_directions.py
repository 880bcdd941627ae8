"""Seeded directions and perturbation: exact restoration, correct perturbed point, distributions."""
import math

import pytest
import torch
from torch.func import functional_call

from components import models
from components.estimators import Directions, add_direction_, perturbed


def _mlp():
    torch.manual_seed(0)
    return models.mlp(16, 5, [32, 8], "tanh")


def _snapshot(model):
    return [p.detach().clone() for p in model.parameters()]


def _bitwise_equal(a, b):
    return all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(a, b))


@pytest.mark.parametrize("kind", ["gaussian", "sphere", "rademacher"])
def test_parameters_bit_identical_after_plus_minus_restore(kind):
    """perturb(+lambda), perturb(-2 lambda), perturb(+lambda): the parameters come back bit for bit."""
    model = _mlp()
    before = _snapshot(model)
    d = Directions(list(model.parameters()), kind)
    x = torch.randn(7, 16)
    lam = 1e-3
    for seed in range(5):
        with perturbed(model, d, seed, +lam):
            model(x)
        assert _bitwise_equal(before, _snapshot(model))  # nothing written while perturbed
        with perturbed(model, d, seed, -lam):
            model(x)
    assert _bitwise_equal(before, _snapshot(model))


def test_perturbed_forward_sees_exactly_x_plus_lambda_u():
    model = _mlp()
    d = Directions(list(model.parameters()), "gaussian")
    x = torch.randn(9, 16)
    lam = 0.37
    names = [n for n, _ in model.named_parameters()]
    shifted = {n: torch.add(p.detach(), z, alpha=lam) for n, p, z in zip(names, model.parameters(), d.dense(11))}
    expected = functional_call(model, shifted, (x,))
    with perturbed(model, d, 11, lam):
        got = model(x)
    assert torch.equal(got, expected)


def test_restoration_after_an_exception_mid_forward():
    model = _mlp()
    before = _snapshot(model)
    d = Directions(list(model.parameters()), "gaussian")
    with pytest.raises(RuntimeError):
        with perturbed(model, d, 1, 0.5):
            model(torch.randn(3, 15))  # wrong width: fails inside the first layer
    assert _bitwise_equal(before, _snapshot(model))
    assert all(isinstance(p, torch.nn.Parameter) for p in model.parameters())


def test_directions_regenerate_identically_and_differ_by_seed():
    model = _mlp()
    d = Directions(list(model.parameters()), "gaussian")
    a, b, c = d.dense(5), d.dense(5), d.dense(6)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))


def test_sphere_has_the_declared_radius():
    model = _mlp()
    for radius in (None, 2.5):
        d = Directions(list(model.parameters()), "sphere", radius)
        norm = math.sqrt(sum(float(t.double().square().sum()) for t in d.dense(3)))
        assert norm == pytest.approx(d.radius, rel=1e-5)
    assert Directions(list(model.parameters()), "sphere").radius == pytest.approx(math.sqrt(d.dim))


@pytest.mark.parametrize("kind", ["gaussian", "sphere", "rademacher"])
def test_second_moment_is_identity(kind):
    """E[u u^T] = I for gaussian, rademacher and the sqrt(d)-sphere (so the two-point estimate is unbiased)."""
    p = torch.zeros(6)
    d = Directions([p], kind)
    us = torch.stack([d.tensor(s, 0) for s in range(4000)]).double()
    second = us.T @ us / len(us)
    assert torch.allclose(second, torch.eye(6, dtype=torch.float64), atol=0.12)


def test_add_direction_moves_along_u():
    p = torch.zeros(4)
    d = Directions([p], "gaussian")
    add_direction_(d, 9, 0.5)
    assert torch.allclose(p, 0.5 * d.tensor(9, 0))


def test_unknown_direction_kind():
    with pytest.raises(ValueError, match="allowed: gaussian, sphere, rademacher"):
        Directions([torch.zeros(2)], "cauchy")


def test_parameter_read_outside_its_module_is_refused():
    class Sneaky(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(3, 3)
            self.b = torch.nn.Linear(3, 3)

        def forward(self, x):
            return torch.nn.functional.linear(self.a(x), self.b.weight)  # b's forward never runs

    model = Sneaky()
    d = Directions(list(model.parameters()), "gaussian")
    with pytest.raises(RuntimeError, match="not used through their own module"):
        with perturbed(model, d, 0, 0.1):
            model(torch.randn(2, 3))
