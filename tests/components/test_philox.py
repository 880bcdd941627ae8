"""Counter-based directions, the GPU path (philox.py, ``Directions.swapped``): the same exactness
guarantees as the CPU's chunked streams.

On a machine with a CUDA device these run there. Elsewhere (CI) they run the same Triton kernels on the
CPU through Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1 where there is no GPU), with
``philox.supports`` opened to CPU tensors: the kernels' logic, the swap and the modes' bitwise agreement
are checked everywhere; GPU-only facts (CUDA streams, timings) only on a GPU.
"""
import contextlib
import os

import pytest
import torch

from components import models
from components.directions import Directions, add_direction_, perturbed, philox
from components.directions.streams import ChunkStreams, PhiloxStreams

GPU = torch.cuda.is_available()
pytestmark = pytest.mark.skipif(philox.triton is None or not (GPU or os.environ.get("TRITON_INTERPRET") == "1"),
                                reason="needs Triton, with a CUDA device or its interpreter")
DEVICE = torch.device("cuda" if GPU else "cpu")


@pytest.fixture(autouse=True)
def _counter_based_here(monkeypatch):
    """Every floating parameter list on DEVICE takes the philox path (on a GPU it does anyway)."""
    if not GPU:
        monkeypatch.setattr(philox, "supports", lambda params: bool(params) and all(
            p.device == DEVICE and p.dtype == params[0].dtype and p.dtype in philox._DTYPES for p in params))


def _snapshot(model):
    return [p.detach().clone() for p in model.parameters()]


def _bitwise_equal(a, b):
    return all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(a, b))


class _Bag(torch.nn.Module):
    """An embedding table spanning several kernel blocks (rows straddle their boundaries) under a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(150, 70, padding_idx=0)
        self.head = torch.nn.Linear(70, 3)

    def forward(self, ids):
        return self.head(self.emb(ids).mean(dim=1))


def _ids():
    ids = torch.randint(0, 150, (6, 9), generator=torch.Generator().manual_seed(1))
    ids[0, :3] = 0  # padding rows and repeated ids
    return ids.to(DEVICE)


def test_one_key_is_that_key_of_all():
    """keys() is splitmix64 of one BLAKE2b and the tensor index, the same as key() for each tensor."""
    from components.randomness import public_seed, splitmix64

    assert [philox.key(s, i) for s in (0, 7, 2**62) for i in range(40)] == [
        k for s in (0, 7, 2**62) for k in philox.keys(s, 40)] == [
        splitmix64(public_seed(s), i) for s in (0, 7, 2**62) for i in range(40)]
    assert len(set(philox.keys(3, 1000))) == 1000 and all(0 <= k < 2**63 for k in philox.keys(3, 1000))


def test_the_bag_spans_several_blocks():
    assert _Bag().emb.weight.numel() > 2 * philox.BLOCK


@pytest.mark.parametrize("kind", ["gaussian", "sphere", "rademacher"])
def test_cache_and_regenerate_agree_bitwise(kind):
    """Perturbed forwards (the whole-model swap in cache mode, hooks and embedding rows in regenerate
    mode) and updates: the same values either way, and the parameters come back bit for bit."""
    outs, finals = [], []
    for cache in (False, True):
        model = _Bag().to(DEVICE)
        before = _snapshot(model)
        d = Directions(list(model.parameters()), kind)
        assert d.stream == "cuda-philox-v1" if GPU else isinstance(d._streams, PhiloxStreams)
        with (d.cached([4]) if cache else contextlib.nullcontext()):
            with torch.inference_mode():
                with perturbed(model, d, 4, 1e-3):
                    plus = model(_ids())
                assert _bitwise_equal(before, _snapshot(model))
                assert all(isinstance(p, torch.nn.Parameter) for p in model.parameters())  # swapped back
                with perturbed(model, d, 4, -1e-3):
                    minus = model(_ids())
            assert _bitwise_equal(before, _snapshot(model))
            with torch.no_grad():
                add_direction_(d, 4, -0.01)
        outs.append((plus, minus))
        finals.append(_snapshot(model))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert _bitwise_equal(*finals)


def test_the_perturbed_forward_is_the_one_at_x_plus_lambda_u():
    from torch.func import functional_call

    model = _Bag().to(DEVICE)
    d = Directions(list(model.parameters()), "gaussian")
    shifted = {n: p.detach() + 0.25 * u for (n, p), u in zip(model.named_parameters(), d.dense(3))}
    expected = functional_call(model, shifted, (_ids(),))
    for cache in (False, True):
        with (d.cached([3]) if cache else contextlib.nullcontext()), perturbed(model, d, 3, 0.25):
            torch.testing.assert_close(model(_ids()), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", ["gaussian", "sphere", "rademacher"])
def test_prefetch_draws_the_same_direction(kind):
    plain = Directions(list(_Bag().to(DEVICE).parameters()), kind)
    ahead = Directions(list(_Bag().to(DEVICE).parameters()), kind)
    for seed in (5, 6):
        with plain.cached([seed]):
            expected = [t.clone() for t in plain.iter_tensors(seed)]
        ahead.prefetch([seed])
        with ahead.cached([seed]):
            assert _bitwise_equal(expected, list(ahead.iter_tensors(seed)))


def test_a_tensor_drawn_alone_is_that_tensor_of_the_whole_draw():
    """Values depend on (seed, tensor, position) only: one launch for a whole direction, a tensor or an
    embedding's rows drawn on their own give the same values."""
    params = [torch.zeros(9_000, device=DEVICE), torch.zeros(33, 7, device=DEVICE), torch.zeros(1, device=DEVICE)]
    for kind in ("gaussian", "sphere", "rademacher"):
        d = Directions(params, kind, radius=5.0 if kind == "sphere" else None)
        alone = [d.tensor(9, i).clone() for i in range(3)]
        rows = d.rows(9, 1, torch.tensor([[0, 32], [5, 5]], device=DEVICE))
        with d.cached([9]):
            whole = [t.clone() for t in d.iter_tensors(9)]
        assert _bitwise_equal(alone, whole)
        assert torch.equal(rows, whole[1][torch.tensor([[0, 32], [5, 5]], device=DEVICE)])
        if kind == "rademacher":
            assert set(torch.cat([t.flatten() for t in whole]).unique().tolist()) == {-1.0, 1.0}
        if kind == "sphere":
            norm = torch.cat([t.flatten() for t in whole]).double().norm().item()
            assert abs(norm - 5.0) < 1e-4
        assert not torch.equal(alone[0], d.tensor(10, 0))  # another seed, other values


def _same_bits(a, b):
    return all(x.dtype == y.dtype and torch.equal(x.flatten().view(torch.int16 if x.element_size() == 2 else torch.int32),
                                                  y.flatten().view(torch.int16 if y.element_size() == 2 else torch.int32))
               for x, y in zip(a, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_updates_in_one_launch_or_per_tensor_agree_in_both_modes(dtype):
    """add_all_ (every tensor in one launch, through address tables) and add_to_ (tensor by tensor, the
    momentum path), each with the direction cached or drawn inside the kernel: one result, bit for bit,
    and it is x + s * u computed in float32 and rounded once."""
    gen = torch.Generator().manual_seed(0)
    start = [torch.randn(shape, generator=gen).to(device=DEVICE, dtype=dtype) for shape in ((9_000,), (33, 7), (1,))]
    results = []
    for cache in (False, True):
        for whole in (True, False):
            params = [p.clone() for p in start]
            d = Directions(params, "sphere", radius=3.0)
            with torch.no_grad(), (d.cached([2]) if cache else contextlib.nullcontext()):
                if whole:
                    d.add_all_(2, -0.37)
                else:
                    for i, p in enumerate(params):
                        d.add_to_(2, i, p, -0.37)
            results.append(params)
    assert all(_same_bits(results[0], r) for r in results[1:])
    expected = [(p.float() - 0.37 * u.float()).to(dtype) for p, u in zip(start, d.dense(2))]
    torch.testing.assert_close(results[0], expected)  # within rounding (a GPU fuses the multiply-add)
    assert not _same_bits(results[0], start)


def test_non_contiguous_tensors_get_the_same_values():
    """A non-contiguous parameter or update target goes through a contiguous copy: same values."""
    base = torch.randn(7, 33, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    d = Directions([torch.zeros(33, 7, device=DEVICE)], "gaussian")
    contiguous, strided = base.T.contiguous(), base.T
    assert not strided.is_contiguous()
    out_a, out_b = torch.empty(33, 7, device=DEVICE), torch.empty(33, 7, device=DEVICE)
    d.perturb_into(5, 0, contiguous, out_a, 0.5)
    d.perturb_into(5, 0, strided, out_b, 0.5)
    assert torch.equal(out_a, out_b)
    d.add_to_(5, 0, contiguous, 0.5)
    d.add_to_(5, 0, strided, 0.5)
    assert torch.equal(contiguous, strided) and torch.equal(contiguous, out_a)


def test_an_address_table_must_fit_the_layout():
    d = Directions([torch.zeros(10, device=DEVICE), torch.zeros(3, device=DEVICE)], "gaussian")
    with pytest.raises(ValueError, match="must match the layout"):
        d._streams.layout.table([torch.zeros(10, device=DEVICE), torch.zeros(4, device=DEVICE)])
    with pytest.raises(ValueError, match="must match the layout"):
        d._streams.layout.table([torch.zeros(10, device=DEVICE)])


def test_gaussian_moments_and_independence():
    n = 200_000  # tolerances are 5 standard errors at this size
    d = Directions([torch.zeros(n, device=DEVICE), torch.zeros(n // 8, 8, device=DEVICE)], "gaussian")
    a, rows = d.dense(1)
    c = d.dense(2)[0]
    for u in (a, rows.flatten(), c):
        assert abs(u.double().mean().item()) < 1.2e-2 and abs(u.double().var().item() - 1) < 1.6e-2
    # neighbouring counters, different tensors of one direction and different directions are uncorrelated
    eye = torch.eye(8, dtype=torch.float64, device=DEVICE)
    assert torch.allclose(rows.double().T @ rows.double() / len(rows), eye, atol=0.05)
    assert abs((a.double() * rows.flatten()).mean().item()) < 1.2e-2
    assert abs((a.double() * c).mean().item()) < 1.2e-2


@pytest.mark.parametrize("estimator", [
    {"kind": "two_point", "queries": 2},
    {"kind": "dpgd_0th", "queries": 2},
    {"kind": "pazo_m", "queries": 2, "mix": 0.3, "public_batch_size": 8},
    {"kind": "pazo_p", "public_batches": 3, "public_batch_size": 8},
    {"kind": "pazo_s", "public_batches": 3, "public_batch_size": 8},
])
def test_every_estimator_trains_and_cache_matches_regenerate(tiny_spec_dict, estimator):
    """Whole private loops, cache and regenerate mode, same noise and batches: identical parameters (for
    the estimators with seeded directions), finite and moved from the start."""
    from components import builders
    from components.randomness import private_generator
    import specs

    finals = []
    modes = ("regenerate", "cache") if estimator["kind"] in ("two_point", "dpgd_0th", "pazo_m") else ("auto",)
    for mode in modes:
        est = dict(estimator, **({} if mode == "auto" else {"perturbation": mode}))
        spec = specs.spec_from_dict(dict(tiny_spec_dict, model={"kind": "mlp", "hidden": [64]}, estimator=est,
                                         execution={"backend": "local", "device": DEVICE.type}))
        data = builders.load_data(spec)
        resolved, _, _ = builders.resolve_privacy(spec, len(data.private))
        built = builders.build_loop(resolved, data, noise_generator=private_generator(1),
                                    sampling_generator=private_generator(2))
        assert built.device == DEVICE and isinstance(built.loop.backend.directions._streams, PhiloxStreams)
        start = _snapshot(built.model)
        built.loop.run(6)
        final = _snapshot(built.model)
        assert all(torch.isfinite(p).all() for p in final)
        assert not _bitwise_equal(start, final)
        finals.append(final)
    assert _bitwise_equal(finals[0], finals[-1])


def test_a_parameter_outside_the_model_is_refused_by_the_swap():
    model = _Bag().to(DEVICE)
    stray = torch.nn.Parameter(torch.zeros(3, device=DEVICE))
    d = Directions(list(model.parameters()) + [stray], "gaussian")
    with d.cached([1]), pytest.raises(RuntimeError, match="not parameters of the model's modules"):
        with perturbed(model, d, 1, 1e-3):
            model(_ids())


@pytest.mark.skipif(not GPU, reason="needs a CUDA device")
def test_gpu_directions_are_not_the_cpu_ones():
    """The same seed draws different values on a GPU and on the CPU: a direction stream is identified by
    its device kind as well as its generator version."""
    cpu = Directions([torch.zeros(1000)], "gaussian")
    gpu = Directions([torch.zeros(1000, device=DEVICE)], "gaussian")
    assert (cpu.stream, gpu.stream) == ("cpu-torch-v2", "cuda-philox-v1")
    assert not torch.equal(cpu.dense(3)[0], gpu.dense(3)[0].cpu())


@pytest.mark.skipif(not GPU, reason="needs a CUDA device")
def test_float64_parameters_take_the_chunked_path_on_a_gpu():
    """The kernels compute in float32: float64 parameters would lose precision there, so they are drawn
    by torch's CUDA generator in chunks, a stream of its own."""
    d = Directions([torch.zeros(10, dtype=torch.float64, device=DEVICE)], "gaussian")
    assert isinstance(d._streams, ChunkStreams) and d.stream == "cuda-torch-v2"


@pytest.mark.parametrize("kind", ["gaussian", "sphere", "rademacher"])
def test_the_philox_streams_keep_the_generators_contract(kind):
    """The contract the chunked streams keep (test_directions.py), on the counter-based ones."""
    from tests.components.streams_contract import check_the_contract

    check_the_contract(lambda params: PhiloxStreams(params, kind, 7.0), _Bag().to(DEVICE), table=0)
    assert isinstance(Directions(list(_Bag().to(DEVICE).parameters()), kind)._streams, PhiloxStreams)
