"""The GPU path: the same exactness guarantees as on CPU, checked on a CUDA device.

Skipped where torch sees no GPU (CI has none); run on a GPU machine with
``pytest tests/components/test_cuda.py``.
"""
import contextlib

import pytest
import torch

from components import models
from components.estimators import Directions, add_direction_, perturbed

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = torch.device("cuda")


def _snapshot(model):
    return [p.detach().clone() for p in model.parameters()]


def _bitwise_equal(a, b):
    return all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(a, b))


class _Bag(torch.nn.Module):
    """An embedding table spanning several generation chunks under a linear head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(700, 300, padding_idx=0)
        self.head = torch.nn.Linear(300, 3)

    def forward(self, ids):
        return self.head(self.emb(ids).mean(dim=1))


def _ids():
    return torch.randint(0, 700, (6, 9), generator=torch.Generator().manual_seed(1)).to(CUDA)


@pytest.mark.parametrize("kind", ["gaussian", "sphere", "rademacher"])
def test_cache_and_regenerate_agree_bitwise_on_the_gpu(kind):
    """Perturbed forwards and updates: the same values whether a direction is cached or regenerated
    chunk by chunk, and the parameters come back bit for bit."""
    outs, finals = [], []
    for cache in (False, True):
        model = _Bag().to(CUDA)
        before = _snapshot(model)
        d = Directions(list(model.parameters()), kind)
        with (d.cached([4]) if cache else contextlib.nullcontext()):
            with torch.inference_mode():
                with perturbed(model, d, 4, 1e-3):
                    plus = model(_ids())
                with perturbed(model, d, 4, -1e-3):
                    minus = model(_ids())
            assert _bitwise_equal(before, _snapshot(model))
            with torch.no_grad():
                add_direction_(d, 4, -0.01)
        outs.append((plus, minus))
        finals.append(_snapshot(model))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert _bitwise_equal(*finals)


@pytest.mark.parametrize("kind", ["gaussian", "sphere", "rademacher"])
def test_prefetch_draws_the_same_direction_on_the_gpu(kind):
    plain = Directions(list(_Bag().to(CUDA).parameters()), kind)
    ahead = Directions(list(_Bag().to(CUDA).parameters()), kind)
    for seed in (5, 6):
        with plain.cached([seed]):
            expected = [t.clone() for t in plain.iter_tensors(seed)]
        ahead.prefetch([seed])
        with ahead.cached([seed]):
            assert _bitwise_equal(expected, list(ahead.iter_tensors(seed)))


def test_sphere_radius_and_second_moment_on_the_gpu():
    d = Directions([torch.zeros(40_000, device=CUDA), torch.zeros(3, device=CUDA)], "sphere", radius=7.0)
    norms = [torch.cat([t.flatten() for t in d.dense(s)]).norm().item() for s in range(4)]
    assert all(abs(n - 7.0) < 1e-4 for n in norms)
    g = Directions([torch.zeros(8, device=CUDA)], "gaussian")
    u = torch.stack([g.dense(s)[0] for s in range(4000)]).double()
    second = u.T @ u / len(u)
    assert torch.allclose(second, torch.eye(8, dtype=torch.float64, device=CUDA), atol=0.1)


@pytest.mark.parametrize("estimator", [
    {"kind": "two_point", "queries": 2},
    {"kind": "dpgd_0th", "queries": 2},
    {"kind": "pazo_m", "queries": 2, "mix": 0.3, "public_batch_size": 8},
    {"kind": "pazo_p", "public_batches": 3, "public_batch_size": 8},
    {"kind": "pazo_s", "public_batches": 3, "public_batch_size": 8},
])
def test_every_estimator_trains_on_the_gpu_and_cache_matches_regenerate(tiny_spec_dict, estimator):
    """Whole private loops on the GPU, cache and regenerate mode, same noise and batches: identical
    parameters (for the estimators with seeded directions), finite and moved from the start."""
    from components import builders
    from components.randomness import private_generator
    import specs

    finals = []
    modes = ("regenerate", "cache") if estimator["kind"] in ("two_point", "dpgd_0th", "pazo_m") else ("auto",)
    for mode in modes:
        est = dict(estimator, **({} if mode == "auto" else {"perturbation": mode}))
        spec = specs.spec_from_dict(dict(tiny_spec_dict, model={"kind": "mlp", "hidden": [400]}, estimator=est,
                                         execution={"backend": "local", "device": "cuda"}))
        data = builders.load_data(spec)
        resolved, _, _ = builders.resolve_privacy(spec, len(data.private))
        built = builders.build_loop(resolved, data, noise_generator=private_generator(1),
                                    sampling_generator=private_generator(2))
        assert built.device.type == "cuda" and all(p.is_cuda for p in built.model.parameters())
        start = _snapshot(built.model)
        built.loop.run(12)
        final = _snapshot(built.model)
        assert all(torch.isfinite(p).all() for p in final)
        assert not _bitwise_equal(start, final)
        finals.append(final)
    assert _bitwise_equal(finals[0], finals[-1])


def test_gpu_directions_are_not_the_cpu_ones():
    """The same seed draws different values on a GPU and on the CPU (torch's generators differ): a
    direction stream is identified by its device kind as well as its generator version."""
    cpu = Directions([torch.zeros(1000)], "gaussian").dense(3)[0]
    gpu = Directions([torch.zeros(1000, device=CUDA)], "gaussian").dense(3)[0]
    assert not torch.equal(cpu, gpu.cpu())
    again = Directions([torch.zeros(1000, device=CUDA)], "gaussian").dense(3)[0]
    assert torch.equal(gpu, again)


def test_models_helpers_run_on_the_gpu():
    model = models.mlp(16, 5, [32], "relu").to(CUDA)
    x, y = torch.randn(10, 16, device=CUDA), torch.randint(0, 5, (10,), device=CUDA)
    assert models.per_example_loss(model, x, y).shape == (10,)


def test_gpu_directions_use_counter_based_streams():
    """On a GPU every direction comes from Triton's Philox, one launch per direction, and is a function
    of (seed, tensor, position) only: a tensor drawn alone equals the same tensor of a whole draw."""
    params = [torch.zeros(70_000, device=CUDA), torch.zeros(33, 7, device=CUDA), torch.zeros(1, device=CUDA)]
    for kind in ("gaussian", "sphere", "rademacher"):
        d = Directions(params, kind)
        assert d.stream == "cuda-philox-v1"
        alone = [d.tensor(9, i).clone() for i in range(3)]
        with d.cached([9]):
            whole = [t.clone() for t in d.iter_tensors(9)]
        assert _bitwise_equal(alone, whole)
        if kind == "rademacher":
            assert set(torch.cat([t.flatten() for t in whole]).unique().tolist()) == {-1.0, 1.0}


def test_gpu_gaussian_moments_and_independence():
    d = Directions([torch.zeros(1_000_000, device=CUDA), torch.zeros(1_000_000, device=CUDA)], "gaussian")
    a, b = d.dense(1)
    c = d.dense(2)[0]
    for u in (a, b, c):
        assert abs(u.mean().item()) < 5e-3 and abs(u.double().var().item() - 1) < 5e-3
    # different tensors of one direction, and different directions, are uncorrelated
    assert abs((a * b).mean().item()) < 5e-3 and abs((a * c).mean().item()) < 5e-3
