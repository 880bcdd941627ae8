"""The KL problems Q1-Q5 (components/families/kl/problems.py): their rows, the closed forms against autograd of the
per-example loss, and the stated constants (KL*, Lipschitz, smoothness, weak convexity) on their ball."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.func import functional_call, grad, vmap

from components.families.kl.problems import (KL_PROBLEMS, KlConstants, KlObjective, empirical_minimiser, excess_risk_np,
                                    gradient_np, kl_constants, kl_rows, per_example_gradients_np, row_width)

D = 5
START, RADIUS = 0.2, 1.5
KAPPA = ("mean_pl", "quartic_balanced", "pl_sine", "abs_three_halves")
SMOOTH = ("mean_pl", "quartic_balanced", "pl_sine", "logistic_nonconvex")


def _skewed(problem, seed=3):
    """One-hot rows with counts (10, 1, 1, 1, 1): far from balanced, so the counts' gamma matters."""
    rows = kl_rows(problem, D, 10 * D, seed)
    j = rows[:, :D].argmax(axis=1)
    keep = np.flatnonzero((j == 0) | (np.arange(len(rows)) < D))
    return rows[keep]


DATASETS = {"balanced": lambda p: kl_rows(p, D, 4 * D, 11),  # n a multiple of d
            "unbalanced": lambda p: kl_rows(p, D, 2 * D + 3, 12),
            "skewed": lambda p: _skewed(p) if p in ("quartic_balanced", "abs_three_halves") else kl_rows(p, D, 7, 13)}


def _ball(rng, radius, count, dimension=D, on_sphere=False):
    """Points of the ball B_radius(w0), w0 = START in every coordinate (uniform, or on its boundary)."""
    g = rng.standard_normal((count, dimension))
    r = np.ones(count) if on_sphere else rng.random(count) ** (1 / dimension)
    return START + radius * g / np.linalg.norm(g, axis=1, keepdims=True) * r[:, None]


def _losses(problem, points, rows):
    """f(w; x_i) for each point and row, [P, n], through the module as torch.func sees it."""
    model = KlObjective(problem, torch.zeros(rows.shape[1] - (row_width(problem, 1) - 1)))
    r = torch.from_numpy(rows)
    at = vmap(lambda w: functional_call(model, {"x": w}, (r,)))
    return at(torch.from_numpy(np.asarray(points, dtype=np.float64))).numpy()


def _risk(problem, points, rows):
    return _losses(problem, points, rows).mean(axis=-1)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(KL_PROBLEMS), st.integers(1, 6), st.integers(1, 30), st.integers(0, 2**31 - 1))
def test_rows_are_a_function_of_the_seed(problem, dimension, n, seed):
    rows = kl_rows(problem, dimension, n, seed)
    assert rows.shape == (n, row_width(problem, dimension)) and rows.dtype == np.float64
    assert np.array_equal(rows, kl_rows(problem, dimension, n, seed))
    # continuous draws differ across seeds; one-hot rows differ only through w*'s d signs (checked below),
    # a single recentred pl_sine row is c, and in one dimension a unit vector is +-1
    if problem not in ("quartic_balanced", "abs_three_halves") and dimension > 1 and n > 1:
        assert not np.array_equal(rows, kl_rows(problem, dimension, n, seed + 1))


def test_widths_and_seeds_of_the_designs():
    assert [row_width(p, 7) for p in KL_PROBLEMS] == [7, 8, 7, 8, 8]
    signs = {tuple(kl_rows("quartic_balanced", 12, 12, s)[:, -1]) for s in range(4)}
    assert len(signs) == 4  # w*'s signs come from the seed
    assert np.array_equal(kl_rows("quartic_balanced", 4, 9, 5), kl_rows("abs_three_halves", 4, 9, 5))
    with pytest.raises(ValueError):
        kl_rows("quadratic", 3, 4, 0)
    with pytest.raises(ValueError):
        row_width("quadratic", 3)


def test_rows_follow_the_study():
    d, n = 6, 4000
    c = np.full(d, 1 / math.sqrt(d))
    mean = kl_rows("mean_pl", d, n, 1)
    assert np.linalg.norm(mean - c, axis=1).max() <= 1  # zeta in the unit ball
    # uniform in the ball: P(||zeta|| <= r) = r^d
    assert abs(np.mean(np.linalg.norm(mean - c, axis=1) <= 0.9) - 0.9**d) < 0.03
    sine = kl_rows("pl_sine", d, n, 1)
    assert np.abs(sine.mean(axis=0) - c).max() < 1e-14 and np.linalg.norm(sine - c, axis=1).max() <= 2
    one_hot = kl_rows("quartic_balanced", d, 2 * d + 1, 1)
    j = np.arange(2 * d + 1) % d
    assert np.array_equal(one_hot[:, :d], np.eye(d)[j]) and set(np.abs(one_hot[:, d])) == {0.5}
    assert np.array_equal(one_hot[:, d], empirical_minimiser("quartic_balanced", one_hot, d)[j])
    logistic = kl_rows("logistic_nonconvex", d, n, 1)
    assert np.allclose(np.linalg.norm(logistic[:, :d], axis=1), 1) and set(logistic[:, d]) == {-1.0, 1.0}
    # labels agree with one teacher except for about 10% flips: the best unit vector misclassifies ~10%
    a, y = logistic[:, :d], logistic[:, d]
    teacher = np.linalg.lstsq(a, y, rcond=None)[0]
    assert abs(np.mean(np.sign(a @ teacher) != y) - 0.1) < 0.02


@pytest.mark.parametrize("problem", KL_PROBLEMS)
def test_per_example_gradients_are_autograd_of_the_loss(problem):
    rows = kl_rows(problem, D, 23, 4)
    rng = np.random.default_rng(0)
    model = KlObjective(problem, torch.zeros(D), rows)
    r = torch.from_numpy(rows)

    def loss(w, row):
        return functional_call(model, {"x": w}, (row.unsqueeze(0),)).sum()

    per_example = vmap(grad(loss), in_dims=(None, 0))
    for w in _ball(rng, RADIUS, 4):
        expected = per_example_gradients_np(problem, w, rows)
        assert expected.shape == (23, D)
        assert np.allclose(per_example(torch.from_numpy(w), r).numpy(), expected, rtol=0, atol=1e-10)
        full = gradient_np(problem, w, rows)
        assert np.allclose(full, expected.mean(axis=0), rtol=0, atol=1e-12)
        with torch.no_grad():
            model.x.copy_(torch.from_numpy(w))
        model.zero_grad()
        model(r).mean().backward()
        assert np.allclose(model.x.grad.numpy(), full, rtol=0, atol=1e-12)
        assert model.gradient_norm() == pytest.approx(np.linalg.norm(full), rel=1e-12, abs=1e-15)
    points = _ball(rng, RADIUS, 6).reshape(2, 3, D)  # leading axes are vectorised over
    assert np.allclose(gradient_np(problem, points, rows)[1, 2], gradient_np(problem, points[1, 2], rows))


@pytest.mark.parametrize("problem", KAPPA)
@pytest.mark.parametrize("dataset", sorted(DATASETS))
def test_excess_risk_is_the_loss_above_the_minimiser(problem, dataset):
    rows = DATASETS[dataset](problem)
    rng = np.random.default_rng(1)
    best = empirical_minimiser(problem, rows, D)
    points = _ball(rng, RADIUS, 12)
    from_losses = _risk(problem, points, rows) - _risk(problem, best[None], rows)[0]
    closed = excess_risk_np(problem, points, rows)
    assert np.allclose(closed, from_losses, rtol=1e-12, atol=1e-12)
    assert excess_risk_np(problem, points.reshape(3, 4, D), rows).shape == (3, 4)
    model = KlObjective(problem, torch.from_numpy(points[5]), rows)
    assert model.excess_risk() == closed[5] and model.population_value() == closed[5]


@pytest.mark.parametrize("problem", KAPPA)
def test_minimiser_is_stationary_and_descent_stays_above_it(problem):
    rows = kl_rows(problem, D, 2 * D + 3, 5)
    best = empirical_minimiser(problem, rows, D)
    assert np.abs(gradient_np(problem, best, rows)).max() < 1e-12
    assert excess_risk_np(problem, best, rows) == 0
    floor = _risk(problem, best[None], rows)[0]
    constants = kl_constants(problem, D, START, RADIUS, rows)
    step = 0.05 if constants.smoothness is None else 1 / constants.smoothness
    w = _ball(np.random.default_rng(2), RADIUS, 1)[0]
    path = []
    for _ in range(300):
        path.append(w)
        w = w - step * gradient_np(problem, w, rows)
    path = np.array(path)
    gaps = _risk(problem, path, rows) - floor
    assert gaps.min() >= -1e-12
    assert gaps[-1] < 0.1 * gaps[0]
    assert np.allclose(gaps, excess_risk_np(problem, path, rows), rtol=1e-10, atol=1e-12)


def test_logistic_has_a_gradient_metric_and_no_minimiser():
    rows = kl_rows("logistic_nonconvex", D, 60, 6)
    assert empirical_minimiser("logistic_nonconvex", rows, D) is None
    assert np.isnan(excess_risk_np("logistic_nonconvex", np.zeros((2, D)), rows)).all()
    w = np.full(D, 3.0)
    model = KlObjective("logistic_nonconvex", torch.from_numpy(w), rows)
    assert math.isnan(model.excess_risk())
    metric = np.linalg.norm(gradient_np("logistic_nonconvex", w, rows))
    assert model.population_value() == model.gradient_norm() == metric
    norms = []
    for _ in range(200):  # gradient descent at 1/L1 drives ||grad F|| down; F stays above its lower bound 0
        norms.append(np.linalg.norm(gradient_np("logistic_nonconvex", w, rows)))
        w = w - gradient_np("logistic_nonconvex", w, rows) / 0.45
    assert norms[-1] < 0.05 * norms[0] and _risk("logistic_nonconvex", w[None], rows)[0] > 0
    # the loss is stable far out, where exp(-y <a, w>) overflows
    far = _losses("logistic_nonconvex", np.full((1, D), 1e4), rows)
    assert np.isfinite(far).all()


@pytest.mark.parametrize("problem", KAPPA)
@pytest.mark.parametrize("dataset", sorted(DATASETS))
def test_kl_inequality_on_the_ball(problem, dataset):
    rows = DATASETS[dataset](problem)
    constants = kl_constants(problem, D, START, RADIUS, rows)
    gamma, kappa = constants.gamma, constants.kappa
    rng = np.random.default_rng(3)
    best = empirical_minimiser(problem, rows, D)
    near = best + 1e-3 * rng.standard_normal((100, D))  # where the excess is small
    points = np.concatenate([_ball(rng, RADIUS, 500), near])
    excess = excess_risk_np(problem, points, rows)
    bound = gamma**kappa * np.linalg.norm(gradient_np(problem, points, rows), axis=-1) ** kappa
    assert (excess <= bound * (1 + 1e-9)).all()


@pytest.mark.parametrize("problem", ["quartic_balanced", "abs_three_halves"])
@pytest.mark.parametrize("dataset", sorted(DATASETS))
def test_kl_gamma_of_the_counts_is_attained(problem, dataset):
    """No smaller gamma is valid: the extremal directions of the derivation give equality."""
    rows = DATASETS[dataset](problem)
    constants = kl_constants(problem, D, START, RADIUS, rows)
    best = empirical_minimiser(problem, rows, D)
    p = np.bincount(rows[:, :D].argmax(axis=1), minlength=D) / len(rows)
    if problem == "quartic_balanced":
        u = np.sqrt((1 / p) / (1 / p).sum())  # gradient u_j = p_j v_j^3 with u_j^2 proportional to 1/p_j
        direction = (u / p) ** (1 / 3)
    else:
        direction = np.eye(D)[p.argmin()]  # all of the gradient on the rarest coordinate
    for scale in (1e-2, 0.3, 2.0):
        w = best + scale * direction
        ratio = excess_risk_np(problem, w, rows) / (
            constants.gamma * np.linalg.norm(gradient_np(problem, w, rows))) ** constants.kappa
        assert ratio == pytest.approx(1, rel=1e-9)


def test_pl_sine_constant():
    """g(u) = u^2 + 3 sin^2 u satisfies g <= 16 g'^2 (gamma = 4) on a fine grid; the tight value is ~2.85."""
    u = np.linspace(-40, 40, 800_001)
    u = u[u != 0]
    g, slope = u**2 + 3 * np.sin(u) ** 2, 2 * u + 3 * np.sin(2 * u)
    assert (g <= 16 * slope**2).all() and (g / slope**2).max() < 2.9
    curvature = 2 + 6 * np.cos(2 * u)
    assert curvature.min() >= -4 and curvature.max() <= 8  # weak convexity 4, smoothness 8


@pytest.mark.parametrize("problem", KL_PROBLEMS)
@pytest.mark.parametrize("dataset", ["balanced", "skewed"])
def test_per_example_gradients_are_lipschitz_bounded(problem, dataset):
    rows = DATASETS[dataset](problem)
    lipschitz = kl_constants(problem, D, START, RADIUS, rows).lipschitz
    rng = np.random.default_rng(4)
    points = np.concatenate([_ball(rng, RADIUS, 200), _ball(rng, RADIUS, 300, on_sphere=True)])
    largest = max(np.linalg.norm(per_example_gradients_np(problem, w, rows), axis=1).max() for w in points)
    assert largest <= lipschitz * (1 + 1e-12)


@pytest.mark.parametrize("problem", ["mean_pl", "quartic_balanced", "abs_three_halves"])
def test_lipschitz_constant_is_the_supremum(problem):
    """mean_pl and the one-hot designs state the exact supremum over the ball: a boundary point attains it."""
    rows = kl_rows(problem, D, 30, 8)
    lipschitz = kl_constants(problem, D, START, RADIUS, rows).lipschitz
    w0 = np.full(D, START)
    if problem == "mean_pl":
        far = rows[np.linalg.norm(w0 - rows, axis=1).argmax()]
        w = w0 + RADIUS * (w0 - far) / np.linalg.norm(w0 - far)
    else:
        target = empirical_minimiser(problem, rows, D)
        j = np.abs(w0 - target).argmax()
        w = w0 + RADIUS * np.sign(w0[j] - target[j]) * np.eye(D)[j]
    largest = np.linalg.norm(per_example_gradients_np(problem, w, rows), axis=1).max()
    assert largest == pytest.approx(lipschitz, rel=1e-12)


@pytest.mark.parametrize("problem", SMOOTH)
def test_per_example_gradients_are_smooth(problem):
    rows = kl_rows(problem, D, 15, 9)
    smoothness = kl_constants(problem, D, START, RADIUS, rows).smoothness
    rng = np.random.default_rng(5)
    w, v = _ball(rng, RADIUS, 300), _ball(rng, RADIUS, 300)
    w[:100] = v[:100] + 1e-3 * rng.standard_normal((100, D))  # close pairs probe the largest curvature
    for a, b in zip(w, v):
        change = np.linalg.norm(per_example_gradients_np(problem, a, rows) - per_example_gradients_np(problem, b, rows),
                                axis=1)
        assert change.max() <= smoothness * np.linalg.norm(a - b) * (1 + 1e-9)


@pytest.mark.parametrize("problem", KL_PROBLEMS)
def test_per_example_losses_are_weakly_convex(problem):
    rows = kl_rows(problem, D, 15, 10)
    weak = kl_constants(problem, D, START, RADIUS, rows).weak_convexity
    rng = np.random.default_rng(6)
    w, v = _ball(rng, RADIUS, 200), _ball(rng, RADIUS, 200)
    t = rng.random((200, 1))
    chord = t * _losses(problem, w, rows) + (1 - t) * _losses(problem, v, rows)
    middle = _losses(problem, t * w + (1 - t) * v, rows)
    slack = weak * t * (1 - t) * (np.linalg.norm(w - v, axis=1, keepdims=True) ** 2) / 2
    assert (middle <= chord + slack + 1e-12).all()


@pytest.mark.parametrize("problem", KL_PROBLEMS)
def test_initial_gap_is_exact(problem):
    rows = kl_rows(problem, D, 2 * D + 1, 14)
    gap = kl_constants(problem, D, START, RADIUS, rows).initial_gap
    best = empirical_minimiser(problem, rows, D)
    floor = 0.0 if best is None else _risk(problem, best[None], rows)[0]  # logistic: F >= 0
    assert gap == pytest.approx(_risk(problem, np.full((1, D), START), rows)[0] - floor, rel=1e-12, abs=1e-15)


def test_constants_of_the_study():
    """The study's numbers (§6.1): balanced designs at d = 10, w0 = 0, on B_0.6(0)."""
    d = 10
    quartic = kl_constants("quartic_balanced", d, 0.0, 0.6, kl_rows("quartic_balanced", d, 100, 0))
    assert quartic.gamma == pytest.approx(math.sqrt(d) / 2**1.5) and quartic.kappa == pytest.approx(4 / 3)
    assert quartic.lipschitz == pytest.approx(1.1**3) and quartic.smoothness == pytest.approx(3 * 1.1**2)
    assert quartic.initial_gap == pytest.approx(0.015625)
    three_halves = kl_constants("abs_three_halves", d, 0.0, 0.6, kl_rows("abs_three_halves", d, 100, 0))
    assert three_halves.gamma == pytest.approx(2 * d ** (2 / 3) / 3) and three_halves.kappa == 3
    assert three_halves.lipschitz == pytest.approx(1.5 * math.sqrt(1.1)) and three_halves.smoothness is None
    mean = kl_constants("mean_pl", d, 0.0, 0.6, kl_rows("mean_pl", d, 100, 0))
    assert (mean.gamma, mean.kappa, mean.smoothness) == (pytest.approx(1 / math.sqrt(2)), 2, 1)
    assert mean.lipschitz <= 0.6 + 2
    sine = kl_constants("pl_sine", d, 0.0, 0.6, kl_rows("pl_sine", d, 100, 0))
    assert (sine.gamma, sine.kappa, sine.smoothness, sine.weak_convexity) == (4, 2, 8, 4)
    logistic = kl_constants("logistic_nonconvex", d, 0.0, 0.6, kl_rows("logistic_nonconvex", d, 100, 0))
    assert logistic == KlConstants(None, None, 1 + 0.1 * 3 * math.sqrt(3) / 8 * math.sqrt(d), 0.45, 0.05,
                                   pytest.approx(math.log(2)))


def test_exact_evaluation_needs_the_rows():
    model = KlObjective("mean_pl", torch.zeros(3))
    assert model.objective == "mean_pl" and model.dimension == 3 and model.x.dtype == torch.float64
    assert model(torch.zeros(4, 3, dtype=torch.float32)).shape == (4,)
    for value in (model.excess_risk, model.gradient_norm, model.population_value):
        with pytest.raises(ValueError):
            value()
    with pytest.raises(ValueError):
        KlObjective("quartic_balanced", torch.zeros(3), kl_rows("quartic_balanced", 4, 8, 0))  # wrong width
    with pytest.raises(ValueError):
        model(torch.zeros(2, 4))
    with torch.device("meta"):  # shapes only, as a spec check builds it
        assert KlObjective("pl_sine", torch.empty(6)).dimension == 6
    assert not list(model.buffers())  # the private rows are not module state
