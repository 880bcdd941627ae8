"""O2NC (components/optimizers/o2nc.py): the online learner's increments stay in the ball of radius D, the
query points lie on the moves, windows stay within W D of their average, the output is window k*'s average,
and a resumed optimizer continues exactly."""
import math

import numpy as np
import pytest
import torch

from components.directions import Directions
from components.queries import Update
from components.optimizers.o2nc import O2nc


def _params(seed=0, shapes=((3, 4), (5,))):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]


def _flat(tensors):
    return torch.cat([t.detach().double().flatten() for t in tensors])


def _gradient(params, gen, scale=5.0):
    # a noisy gradient, large enough that the projection binds on some steps and not on others
    return Update(dense=((tuple(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in params), 1.0),))


def _run(opt, params, steps, gen):
    points, iterates = [_flat(params)], []
    for _ in range(steps):
        opt.apply(_gradient(params, gen, scale=float(torch.rand(1, generator=gen)) * 10))
        points.append(_flat(params))
        iterates.append(torch.cat([x.flatten() for x in opt._x]).clone())
    return points, iterates


@pytest.mark.parametrize("restart", [False, True], ids=["o2nc-002", "o2nc-001-epochs"])
def test_every_move_is_at_most_d_and_windows_stay_within_w_d_of_their_average(restart):
    params = _params()
    opt = O2nc(Directions(params, "sphere"), step_bound=0.05, lr=0.002, window=6, steps=36, seed=4,
               restart_every=6 if restart else None)
    points, iterates = _run(opt, params, 35, torch.Generator().manual_seed(1))
    d, w = 0.05, 6
    bound_hits = 0
    previous = _flat(_params())
    for k, x in enumerate(iterates):
        step = torch.linalg.vector_norm(x - previous)
        assert step <= d * (1 + 1e-12)
        bound_hits += bool(step >= d * (1 - 1e-9))
        previous = x
    assert 0 < bound_hits < len(iterates)  # the projection bound, and did not always
    for a, b in zip(points, points[1:]):  # consecutive query points: at most 2D apart
        assert torch.linalg.vector_norm(b - a) <= 2 * d * (1 + 1e-12)
    for k in range(len(points) // w):
        window = torch.stack(points[k * w:(k + 1) * w])
        assert torch.linalg.vector_norm(window - window.mean(0), dim=1).max() <= w * d
    if restart:  # each epoch's first query point is the iterate itself (OSD restarted at 0)
        for k in range(1, len(points) // w):
            assert torch.equal(points[k * w], iterates[k * w - 1])


def test_query_points_lie_on_the_moves_at_the_public_fractions():
    params = _params()
    opt = O2nc(Directions(params, "sphere"), step_bound=0.1, lr=0.05, window=4, steps=20, seed=9)
    start = _flat(params)
    points, iterates = _run(opt, params, 10, torch.Generator().manual_seed(2))
    assert torch.equal(points[0], start)  # z_1 = x_0
    before = start
    for t, (z, x) in enumerate(zip(points[1:], iterates), start=2):
        s = float(np.random.default_rng([9, t]).random())
        assert torch.allclose(z, before + s * (x - before), rtol=0, atol=1e-12)
        before = x


def test_the_output_is_the_average_of_window_k_star_drawn_from_the_seed():
    params = _params()
    opt = O2nc(Directions(params, "sphere"), step_bound=0.1, lr=0.05, window=5, steps=30, seed=11)
    k = opt.output_window
    assert k == int(np.random.default_rng(11).integers(1, 7)) and 1 <= k <= 6
    points, _ = _run(opt, params, 29, torch.Generator().manual_seed(3))
    opt.finalize()
    expected = torch.stack(points[(k - 1) * 5:k * 5]).mean(0)
    assert torch.allclose(_flat(params), expected, rtol=0, atol=1e-12)


def test_a_resumed_optimizer_continues_exactly():
    params = _params()
    opt = O2nc(Directions(params, "sphere"), step_bound=0.1, lr=0.05, window=4, steps=16, seed=5)
    gen = torch.Generator().manual_seed(4)
    _run(opt, params, 6, gen)
    state, saved = opt.state_dict(), [p.clone() for p in params]
    rest, _ = _run(opt, params, 9, torch.Generator().manual_seed(8))

    resumed_params = [p.clone() for p in saved]
    resumed = O2nc(Directions(resumed_params, "sphere"), step_bound=0.1, lr=0.05, window=4, steps=16, seed=5)
    resumed.load_state_dict(state)
    again, _ = _run(resumed, resumed_params, 9, torch.Generator().manual_seed(8))
    assert all(torch.equal(a, b) for a, b in zip(rest, again))


@pytest.mark.parametrize("kwargs, message", [
    ({"step_bound": 0.0}, "optimizer.step_bound: 0.0 must be a finite number > 0"),
    ({"lr": math.inf}, "optimizer.lr: inf must be a finite number > 0"),
    ({"window": 40}, "optimizer.window: 40 must be between 1 and the 20 steps"),
    ({"restart_every": 3}, "optimizer.restart_every: 3 must equal the window (5)"),
])
def test_bad_arguments_are_one_line(kwargs, message):
    args = dict(step_bound=0.1, lr=0.05, window=5, steps=20, seed=0)
    args.update(kwargs)
    with pytest.raises(ValueError) as err:
        O2nc(Directions(_params(), "sphere"), **args)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
