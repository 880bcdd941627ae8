"""DPZero's two-point estimator: sensitivity, unbiasedness on a quadratic, public plans."""
import math

import torch

from tests.components.quadratic import Quadratic, quad_loss
from hypothesis import given, settings
from hypothesis import strategies as st

from components.directions import Directions
from components.estimators import TwoPointEstimator
from components.queries import FiniteDifferences, Seeded
from components.queries.clipped_sums import clip_sum, per_example_values, vector_clip_coefficients




def test_direction_seeds_are_public_and_reproducible():
    est = TwoPointEstimator(queries=3)
    assert est.direction_seeds(7, seed=1) == est.direction_seeds(7, seed=1)
    assert est.direction_seeds(7, seed=1) != est.direction_seeds(8, seed=1)
    assert est.direction_seeds(7, seed=1) != est.direction_seeds(7, seed=2)
    assert len(set(est.direction_seeds(7, seed=1))) == 3


def test_finite_difference_is_exact_directional_derivative_on_quadratic():
    d = 5
    model = Quadratic(d)
    with torch.no_grad():
        model.x.copy_(torch.randn(d, dtype=torch.float64))
    dirs = Directions([model.x], "gaussian")
    est = TwoPointEstimator(queries=1, smoothing=0.1)
    centres = torch.randn(4, d, dtype=torch.float64)
    (seed,) = est.direction_seeds(0, seed=0)
    values = per_example_values(model, dirs, quad_loss, centres, torch.zeros(4), FiniteDifferences((Seeded(seed),), 0.1))
    u = dirs.tensor(seed, 0)
    grads = model.a * (model.x.detach() - centres)  # per-example gradient
    assert torch.allclose(values[0], grads @ u, atol=1e-9)  # central difference is exact on quadratics


def test_two_point_estimate_is_unbiased_on_quadratic():
    d = 4
    model = Quadratic(d)
    with torch.no_grad():
        model.x.copy_(torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64))
    centres = torch.zeros(1, d, dtype=torch.float64)
    true_grad = model.a * model.x.detach()
    for kind in ("gaussian", "sphere"):
        dirs = Directions([model.x], kind)
        est = TwoPointEstimator(queries=1, smoothing=1e-3)
        total = torch.zeros(d, dtype=torch.float64)
        n = 6000
        for step in range(n):
            (seed,) = est.direction_seeds(step, seed=5)
            query = FiniteDifferences((Seeded(seed),), est.smoothing)
            a = per_example_values(model, dirs, quad_loss, centres, torch.zeros(1), query)[0, 0]
            total += a * dirs.tensor(seed, 0)
        estimate = total / n
        assert torch.allclose(estimate, true_grad, atol=0.35 * true_grad.norm().item() / 2), (kind, estimate, true_grad)


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=20),
    # a diverged example's loss difference can be NaN or infinite: still at most C
    extra=st.one_of(st.floats(-1e9, 1e9, allow_nan=False), st.sampled_from([math.nan, math.inf, -math.inf])),
    clip=st.floats(0.01, 100.0),
    drop=st.integers(0, 19),
)
def test_one_example_moves_each_clipped_sum_by_at_most_clip(values, extra, clip, drop):
    base = torch.tensor([values], dtype=torch.float64)
    s = clip_sum(base, clip)
    added = clip_sum(torch.tensor([values + [extra]], dtype=torch.float64), clip)  # add one example
    assert abs(float(added - s)) <= clip * (1 + 1e-12)
    if len(values) > 1:
        kept = [v for i, v in enumerate(values) if i != drop % len(values)]  # remove one example
        assert abs(float(clip_sum(torch.tensor([kept], dtype=torch.float64), clip) - s)) <= clip * (1 + 1e-12)
        replaced = list(values)
        replaced[drop % len(values)] = extra  # replace one: at most 2C
        assert abs(float(clip_sum(torch.tensor([replaced], dtype=torch.float64), clip) - s)) <= 2 * clip * (1 + 1e-12)




@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=3, max_size=3), min_size=1, max_size=8),
    extra=st.one_of(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=3, max_size=3),
                    st.sampled_from([[math.nan, 0.0, 1.0], [math.inf, 1.0, 2.0], [-math.inf, math.nan, 0.0]])),
    clip=st.floats(0.01, 100.0),
)
def test_one_example_moves_the_vector_clipped_sum_by_at_most_clip(values, extra, clip):
    """DPGD-0th: adding one example (finite or not) moves sum_j w_j u_j by at most C in L2."""
    q = 3
    u = torch.randn(q, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    gram_matrix = u @ u.T
    base = torch.tensor(values, dtype=torch.float64).T  # [q, b]
    added = torch.cat([base, torch.tensor([extra], dtype=torch.float64).T], dim=1)
    w0 = vector_clip_coefficients(base, gram_matrix, clip)
    w1 = vector_clip_coefficients(added, gram_matrix, clip)
    assert torch.isfinite(w1).all()
    assert float(((w1 - w0) @ u).norm()) <= clip * (1 + 1e-9)
