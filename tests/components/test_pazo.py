"""PAZO's estimators against closed forms on quadratics (PAZO §A.1, Algorithms 1-3)."""
import math

import pytest
import torch

from tests.components.quadratic import Quadratic, quad_loss

from components.directions import Directions
from components.estimators import PazoMEstimator, PazoPEstimator, PazoSEstimator
from components.queries.clipped_sums import evaluate_query
from components.estimators.pazo import subspace_basis, _flatten
from components.estimators.public import PublicOracle
from components.queries import FiniteDifferences, Seeded




class ExactContext:
    """A step context with no noise and no clipping: releases the exact mean over the given rows."""

    def __init__(self, model, directions, centres, public, step=0, seed=0):
        self.model, self.directions, self.centres = model, directions, centres
        self.public, self.step, self.seed = public, step, seed
        self.batch_normaliser = float(len(centres))
        self.queries = []

    def release(self, query):
        self.queries.append(query)
        return evaluate_query(self.model, self.directions, quad_loss, self.centres, torch.zeros(len(self.centres)),
                              query, math.inf)


def _setup(d=6, n_public=40):
    torch.manual_seed(0)
    model = Quadratic(d, torch.linspace(-1.0, 2.0, d, dtype=torch.float64))
    params = [model.x]
    public_centres = torch.randn(n_public, d, dtype=torch.float64)
    public = PublicOracle(model, params, quad_loss, public_centres, torch.zeros(n_public), seed=0)
    private_centres = torch.randn(30, d, dtype=torch.float64) * 0.5
    grad = (model.a * (model.x.detach() - private_centres)).mean(dim=0)  # gradient of the private mean loss
    return model, params, public, private_centres, grad


def _dense_update(update, d):
    total = torch.zeros(d, dtype=torch.float64)
    for tensors, coef in update.dense:
        total += coef * tensors[0]
    return total


def test_pazo_p_orthonormal_is_unbiased_for_the_projected_gradient():
    d = 6
    model, params, public, private, grad = _setup(d)
    est = PazoPEstimator(queries=1, smoothing=1e-3, public_batches=3, public_batch_size=8, basis="orthonormal")
    dirs = Directions(params, "gaussian")
    total = torch.zeros(d, dtype=torch.float64)
    n = 3000
    for step in range(n):
        ctx = ExactContext(model, dirs, private, public, step=0, seed=step)  # same G (step 0), fresh u each time
        total += _dense_update(est.step(ctx), d)
    g = subspace_basis([public.gradient(b) for b in public.batches(0, 3, 8)], "orthonormal")
    assert torch.allclose(g.T @ g, torch.eye(3, dtype=torch.float64), atol=1e-10)
    projected = g @ (g.T @ grad)
    assert torch.allclose(total / n, projected, atol=0.08 * projected.norm().item())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("basis", ["orthonormal", "normalized"])
def test_pazo_p_basis_of_half_precision_gradients_is_float32(dtype, basis):
    """A bf16 / fp16 model's public gradients come in its precision, which QR has no kernel for: G is formed in
    float32, the same basis as from the same values in float64."""
    gen = torch.Generator().manual_seed(0)
    grads = [tuple(torch.randn(shape, generator=gen).to(dtype) for shape in ((3, 4), (5,))) for _ in range(3)]
    g = subspace_basis(grads, basis)
    want = subspace_basis([tuple(t.double() for t in gr) for gr in grads], basis)
    assert g.dtype == torch.float32 and g.shape == (17, 3)
    if basis == "orthonormal":  # the same subspace (QR's column signs may differ): equal projections
        assert torch.allclose(g.T @ g, torch.eye(3), atol=1e-6)
        torch.testing.assert_close((g @ g.T).double(), want @ want.T, rtol=0, atol=1e-6)
    else:
        torch.testing.assert_close(g.double(), want, rtol=0, atol=1e-6)


def test_pazo_p_directions_have_norm_sqrt_k():
    d = 6
    model, params, public, private, _ = _setup(d)
    est = PazoPEstimator(queries=4, smoothing=1e-3, public_batches=3, public_batch_size=8, basis="orthonormal")
    ctx = ExactContext(model, Directions(params, "gaussian"), private, public)
    est.step(ctx)
    (query,) = ctx.queries
    for direction in query.directions:
        assert float(direction.tensors[0].norm()) == pytest.approx(math.sqrt(3))


def test_pazo_m_radius_d_quarter_matches_the_gradient_norm():
    """With u on d^(1/4) S^(d-1): E||(grad . u) u||^2 = ||grad||^2 (PAZO §A.1)."""
    d = 64
    model, params, public, private, grad = _setup(d)
    dirs = Directions(params, "sphere", radius=d ** 0.25)
    est = PazoMEstimator(queries=1, smoothing=1e-4, mix=0.0, public_batch_size=8)
    sq = []
    for step in range(4000):
        ctx = ExactContext(model, dirs, private, public, step=step)
        update = est.step(ctx)
        ((seed, coef),) = update.terms
        sq.append(coef ** 2 * float(dirs.tensor(seed, 0).square().sum()))
    assert sum(sq) / len(sq) == pytest.approx(float(grad.square().sum()), rel=0.1)


def test_pazo_m_mixes_public_gradient_with_weight_alpha():
    d = 6
    model, params, public, private, _ = _setup(d)
    est = PazoMEstimator(queries=1, smoothing=1e-3, mix=0.25, public_batch_size=8)
    update = est.step(ExactContext(model, Directions(params, "sphere", d ** 0.25), private, public))
    ((g_pub, alpha),) = update.dense
    assert alpha == 0.25
    (batch,) = public.batches(0, 1, 8)
    assert torch.equal(g_pub[0], public.gradient(batch)[0])


def test_pazo_s_candidates_are_pairwise_different_and_from_disjoint_batches():
    d = 6
    model, params, public, private, _ = _setup(d)
    batches = public.batches(0, 3, 8)
    flat = [set(b.tolist()) for b in batches]
    assert all(not (flat[i] & flat[j]) for i in range(3) for j in range(i + 1, 3))
    est = PazoSEstimator(public_batches=3, public_batch_size=8, candidate_noise=1e-3, lr=0.1)
    ctx = ExactContext(model, Directions(params, "gaussian"), private, public)
    update = est.step(ctx)
    cands = [_flatten(c) for c in est.last_candidates]
    assert len(cands) == 4
    assert all(not torch.equal(cands[i], cands[j]) for i in range(4) for j in range(i + 1, 4))
    assert [q.size for q in ctx.queries] == [3, 1]  # k + 1 queries in two rounds
    ((chosen, coef),) = update.dense
    assert coef == 1.0 and any(torch.equal(_flatten(chosen), c) for c in cands)


def test_pazo_s_picks_the_candidate_with_the_lowest_private_loss():
    d = 6
    model, params, public, private, _ = _setup(d)
    est = PazoSEstimator(public_batches=3, public_batch_size=8, candidate_noise=0.0, lr=0.2)
    ctx = ExactContext(model, Directions(params, "gaussian"), private, public)
    update = est.step(ctx)
    losses = []
    for c in est.last_candidates:
        x = model.x.detach() - 0.2 * c[0]
        losses.append(float(quad_loss(type("M", (), {"__call__": lambda self, f: 0.5 * (model.a * (x - f) ** 2).sum(1)})(), private, None).mean()))
    assert torch.equal(update.dense[0][0][0], est.last_candidates[int(torch.tensor(losses).argmin())][0])


def test_public_batches_refuse_more_rows_than_the_split_has():
    _, _, public, _, _ = _setup(n_public=10)
    with pytest.raises(ValueError, match="need 12 public rows, the split has 10"):
        public.batches(0, 3, 4)


def test_public_warm_start_keeps_bf16_updates_rounding_would_lose():
    """bf16 weights warm-started on public rows step through float32 copies: the result is the float32
    trajectory rounded once, where stepping bf16 in place loses the updates under half a unit in the last place."""
    import numpy as np

    from components.estimators.public import STREAM_WARM_START, warm_start
    from components.randomness import public_seed

    torch.manual_seed(0)
    x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))

    def loss(model, f, t):
        return torch.nn.functional.cross_entropy(model(f.to(model.weight.dtype)).float(), t, reduction="none")

    model = torch.nn.Linear(8, 3, bias=False).to(torch.bfloat16)
    start = model.weight.detach().clone()
    steps = warm_start(model, [model.weight], loss, x, y, epochs=4.0, lr=1e-4, batch_size=16, seed=1)
    # the float32 trajectory, and bf16 stepped in place, each step's gradient at the weights the model holds
    exact, in_place = start.float(), start.clone()
    probe = torch.nn.Linear(8, 3, bias=False).to(torch.bfloat16)
    order, rng = [], np.random.default_rng(public_seed(1, STREAM_WARM_START))
    for _ in range(steps):
        if len(order) < 16:
            order += rng.permutation(64).tolist()
        idx = torch.as_tensor(order[:16])
        del order[:16]
        for weights in (exact, in_place):
            with torch.no_grad():
                probe.weight.copy_(weights)
            g, = torch.autograd.grad(loss(probe, x[idx], y[idx]).mean(), [probe.weight])
            weights.add_(g.to(weights.dtype), alpha=-1e-4)
    assert steps == 16 and torch.equal(model.weight, exact.to(torch.bfloat16))
    lost = (in_place == start).float().mean()
    assert lost > 0.5 and not torch.equal(model.weight, start)  # in place, most weights never moved
