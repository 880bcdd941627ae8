"""Seeded directions and perturbation: exact restoration, correct perturbed point, distributions."""
import contextlib
import math

import pytest
import torch
from torch.func import functional_call

from components import models
from components.directions import Directions, add_direction_, perturbed


def _mlp():
    torch.manual_seed(0)
    return models.mlp(16, 5, [32, 8], "tanh")


def _snapshot(model):
    return [p.detach().clone() for p in model.parameters()]


def _mode(d, seed, cache):
    """Cache mode (the direction drawn once, parameters swapped at once) or regenerate mode (hooks)."""
    return d.cached([seed]) if cache else contextlib.nullcontext()


def _bitwise_equal(a, b):
    return all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(a, b))


@pytest.mark.parametrize("cache", [False, True])
@pytest.mark.parametrize("kind", ["gaussian", "sphere", "rademacher"])
def test_parameters_bit_identical_after_plus_minus_restore(kind, cache):
    """perturb(+lambda), perturb(-2 lambda), perturb(+lambda): the parameters come back bit for bit."""
    model = _mlp()
    before = _snapshot(model)
    d = Directions(list(model.parameters()), kind)
    x = torch.randn(7, 16)
    lam = 1e-3
    for seed in range(5):
        with _mode(d, seed, cache):
            with perturbed(model, d, seed, +lam):
                model(x)
            assert _bitwise_equal(before, _snapshot(model))  # nothing written while perturbed
            with perturbed(model, d, seed, -lam):
                model(x)
    assert _bitwise_equal(before, _snapshot(model))
    assert all(isinstance(p, torch.nn.Parameter) for p in model.parameters())


@pytest.mark.parametrize("cache", [False, True])
def test_perturbed_forward_sees_exactly_x_plus_lambda_u(cache):
    model = _mlp()
    d = Directions(list(model.parameters()), "gaussian")
    x = torch.randn(9, 16)
    lam = 0.37
    names = [n for n, _ in model.named_parameters()]
    shifted = {n: torch.add(p.detach(), z, alpha=lam) for n, p, z in zip(names, model.parameters(), d.dense(11))}
    expected = functional_call(model, shifted, (x,))
    with _mode(d, 11, cache), perturbed(model, d, 11, lam):
        got = model(x)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("cache", [False, True])
def test_restoration_after_an_exception_mid_forward(cache):
    model = _mlp()
    before = _snapshot(model)
    d = Directions(list(model.parameters()), "gaussian")
    with pytest.raises(RuntimeError):
        with _mode(d, 1, cache), perturbed(model, d, 1, 0.5):
            model(torch.randn(3, 15))  # wrong width: fails inside the first layer
    assert _bitwise_equal(before, _snapshot(model))
    assert all(isinstance(p, torch.nn.Parameter) for p in model.parameters())
    assert not any(h for m in model.modules() for h in (m._forward_hooks, m._forward_pre_hooks))


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
    # cache mode swaps every parameter before the forward, so such a read sees x + lambda u too
    x = torch.randn(2, 3)
    shifted = {n: torch.add(p.detach(), z, alpha=0.1) for (n, p), z in zip(model.named_parameters(), d.dense(0))}
    with d.cached([0]), perturbed(model, d, 0, 0.1):
        got = model(x)
    assert torch.equal(got, functional_call(model, shifted, (x,)))


class _Bag(torch.nn.Module):
    """An embedding table spanning several generation chunks (rows straddle chunk boundaries) under a
    linear head: the shape of a transformer's word embeddings."""

    def __init__(self, vocab=700, dim=300, max_norm=None):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(vocab, dim, padding_idx=0, max_norm=max_norm)
        self.head = torch.nn.Linear(dim, 3)

    def forward(self, ids):
        return self.head(self.emb(ids).mean(dim=1))


def _ids():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 700, (6, 9), generator=g)
    ids[0, :3] = 0  # padding rows and repeated ids
    ids[1, :4] = 699
    return ids


@pytest.mark.parametrize("kind", ["gaussian", "sphere", "rademacher"])
@pytest.mark.parametrize("cache", [False, True])
def test_embedding_rows_are_perturbed_as_the_whole_table(kind, cache):
    """W[ids] + s V[ids] is the forward at W + s V: equal to a forward with the whole table perturbed."""
    from components.directions import CHUNK
    model = _Bag()
    assert model.emb.weight.numel() > 3 * CHUNK
    d = Directions(list(model.parameters()), kind)
    ids, lam = _ids(), 0.25
    shifted = {n: torch.add(p.detach(), z, alpha=lam) for (n, p), z in zip(model.named_parameters(), d.dense(4))}
    expected = functional_call(model, shifted, (ids,))
    before = _snapshot(model)
    with (d.cached([4]) if cache else contextlib.nullcontext()):
        with perturbed(model, d, 4, lam):
            got = model(ids)
    assert torch.equal(got, expected)
    assert _bitwise_equal(before, _snapshot(model))


def test_embedding_rows_identical_in_cache_and_regenerate_mode():
    model = _Bag()
    d = Directions(list(model.parameters()), "sphere")
    ids = _ids()
    with perturbed(model, d, 7, 1e-3):
        regenerated = model(ids)
    with d.cached([7]):
        with perturbed(model, d, 7, 1e-3):
            cached = model(ids)
    assert torch.equal(regenerated, cached)
    dense = d.dense(7)[0]
    assert torch.equal(d.rows(7, 0, ids), dense[ids])


def test_cache_mode_swaps_all_but_the_embedding_table():
    """Cache mode's perturbed copy holds every tensor but a plain embedding table, whose looked-up rows
    are perturbed instead: the copy costs the non-embedding parameters, not the table."""
    model = _Bag()
    d = Directions(list(model.parameters()), "gaussian")
    with d.cached([3]), torch.inference_mode(), perturbed(model, d, 3, 1e-3):
        assert model.head.weight is not d.params[1]  # swapped for its perturbed copy
        model(_ids())
    table = [i for i, p in enumerate(d.params) if p is model.emb.weight]
    assert table and all((buf is None) == (i in table) for i, buf in enumerate(d._streams._swap))
    assert all(isinstance(p, torch.nn.Parameter) for p in model.parameters())


@pytest.mark.parametrize("cache", [False, True])
def test_table_tied_to_a_head_is_perturbed_once_everywhere(cache):
    """A language model's tied embedding and output weight: both uses see W + s V, exactly once."""
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.emb = torch.nn.Embedding(50, 8)
            self.head = torch.nn.Linear(8, 50, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, ids):
            return self.head(self.emb(ids).mean(dim=1))

    model = Tied()
    d = Directions(list(model.parameters()), "gaussian")
    assert len(d.params) == 1
    ids, lam = torch.randint(0, 50, (4, 6)), 0.3
    expected = functional_call(model, {"emb.weight": torch.add(d.params[0].detach(), d.dense(5)[0], alpha=lam)},
                               (ids,), tie_weights=True)
    with torch.no_grad(), _mode(d, 5, cache), perturbed(model, d, 5, lam):
        got = model(ids)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert model.head.weight is model.emb.weight and isinstance(model.emb.weight, torch.nn.Parameter)


@pytest.mark.parametrize("cache", [False, True])
def test_embedding_with_max_norm_is_perturbed_whole(cache):
    """max_norm renormalises looked-up rows of the table inside forward: such a table takes the general
    path (a perturbed copy is renormalised, never x), and the forward is the one at W + s V."""
    model = _Bag(max_norm=1.0)
    d = Directions(list(model.parameters()), "gaussian")
    ids, lam = _ids(), 1e-2
    shifted = {n: torch.add(p.detach(), z, alpha=lam) for (n, p), z in zip(model.named_parameters(), d.dense(2))}
    expected = functional_call(model, shifted, (ids,))
    before = _snapshot(model)
    with torch.no_grad(), _mode(d, 2, cache), perturbed(model, d, 2, lam):
        got = model(ids)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert _bitwise_equal(before, _snapshot(model))


@pytest.mark.parametrize("kind", ["gaussian", "sphere"])
def test_regenerated_update_equals_cached_update(kind):
    """Updates in regenerate mode go a chunk at a time; they must land exactly where cache mode's do."""
    a, b = _Bag(), _Bag()
    da = Directions(list(a.parameters()), kind)
    db = Directions(list(b.parameters()), kind)
    with torch.no_grad():
        add_direction_(da, 3, -0.01)
        with db.cached([3]):
            add_direction_(db, 3, -0.01)
    assert _bitwise_equal(_snapshot(a), _snapshot(b))


def test_regenerate_mode_keeps_no_table_sized_scratch():
    """Regenerate mode's memory: a perturbed forward and an update leave scratch for the largest
    non-embedding module only (here the head), never the size of the table or of the direction."""
    from components.directions import CHUNK
    model = _Bag()
    d = Directions(list(model.parameters()), "sphere")
    with torch.inference_mode(), perturbed(model, d, 1, 1e-3):
        model(_ids())
    with torch.no_grad():
        add_direction_(d, 1, -0.01)
    scratch = sum(stack.capacity for stack in d._pools.values())
    assert scratch == model.head.weight.numel() + model.head.bias.numel()
    assert not d._slots and model.emb.weight.numel() > 3 * CHUNK


@pytest.mark.parametrize("dim", [1, 7, 384, (1 << 15) + 232])
def test_embedding_rows_of_any_width_are_the_tables_rows(dim):
    """Rows cut by a chunk's edge (a width that does not divide the chunk, or wider than one) are drawn in
    two parts; ids repeat, and the first and last rows are among them."""
    rows = max(3, 70000 // dim)
    d = Directions([torch.nn.Parameter(torch.zeros(rows, dim))], "sphere")
    ids = torch.randint(0, rows, (3, 9), generator=torch.Generator().manual_seed(dim))
    ids[0, :3] = torch.tensor([0, rows - 1, 0])
    assert torch.equal(d.rows(6, 0, ids), d.tensor(6, 0)[ids])


class _Head(torch.nn.Module):
    """A small decoder's shape: a tied table and LM head far larger than the layer between them."""

    def __init__(self, bias: bool):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(3000, 48)
        self.mid = torch.nn.Linear(48, 48)
        self.head = torch.nn.Linear(48, 3000, bias=bias)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.mid(self.emb(ids))))


@pytest.mark.parametrize("kind", ["gaussian", "sphere", "rademacher"])
@pytest.mark.parametrize("bias", [False, True])
def test_a_large_linear_layer_is_perturbed_a_block_of_rows_at_a_time(kind, bias, monkeypatch):
    """Regenerate mode's scratch for an LM head is one block of its rows, about the largest other module's
    parameters, and the forward is the one at W + s V: the values cache mode (whole swaps) gives, within
    the rounding another CPU's matrix products may add (on this one they are equal)."""
    from components.directions import perturbation as module

    monkeypatch.setattr(module, "SPLIT_MIN", 1 << 14)
    model = _Head(bias)
    d = Directions(list(model.parameters()), kind)
    index = {id(p): i for i, p in enumerate(d.params)}
    rows = module._split_rows(model, index)[id(model.head)]
    assert rows % 4 == 0 and rows * 48 <= module.CHUNK < model.head.weight.numel() // 4  # 64-element blocks
    ids, lam = torch.randint(0, 3000, (4, 6), generator=torch.Generator().manual_seed(1)), 0.3
    shifted = {n: torch.add(p.detach(), z, alpha=lam) for (n, p), z in zip(model.named_parameters(), d.dense(5))}
    expected = functional_call(model, shifted, (ids,), tie_weights=True)
    before = _snapshot(model)
    with torch.no_grad(), perturbed(model, d, 5, lam):
        regenerated = model(ids)
    with torch.no_grad(), d.cached([5]), perturbed(model, d, 5, lam):
        cached = model(ids)
    torch.testing.assert_close(regenerated, cached, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(regenerated, expected, rtol=1e-5, atol=1e-5)
    assert _bitwise_equal(before, _snapshot(model)) and "forward" not in vars(model.head)
    scratch = sum(stack.capacity for stack in d._pools.values())
    assert scratch == max(48 * 48 + 48, rows * 48 + (rows if bias else 0))
    # the perturbed blocks themselves are the cached swap's rows, bit for bit
    block = torch.empty(rows, 48)
    d.perturb_span_into(5, 0, model.head.weight.detach(), rows * 48, 2 * rows * 48, block, lam)
    assert torch.equal(block, torch.add(model.head.weight.detach(), d.dense(5)[0], alpha=lam)[rows:2 * rows])
    # an exception half way leaves the layer's own forward
    with pytest.raises(RuntimeError, match="boom"), perturbed(model, d, 5, lam):
        raise RuntimeError("boom")
    assert "forward" not in vars(model.head)


@pytest.mark.parametrize("kind", ["gaussian", "sphere", "rademacher"])
def test_prefetched_directions_are_the_ones_cache_mode_draws(kind):
    """A prefetch draws the next step's direction on a background thread, chunk by chunk (the sphere's
    norm and scaling too); the step that takes it over sees exactly the values of a plain draw."""
    import threading

    from components.directions.chunks import CHUNK

    plain = Directions(list(_Bag().parameters()), kind)
    ahead = Directions(list(_Bag().parameters()), kind)
    threads = set()
    draw = ahead._streams._draw

    def recording_draw(base, c, out):
        threads.add(threading.current_thread().name)
        draw(base, c, out)

    ahead._streams._draw = recording_draw
    for seed in (5, 6):
        with plain.cached([seed]):
            expected = [t.clone() for t in plain.iter_tensors(seed)]
        ahead.prefetch([seed])
        with ahead.cached([seed]):
            got = list(ahead.iter_tensors(seed))
            assert _bitwise_equal(expected, got)
            if kind == "sphere":
                assert ahead._streams.norms[seed] == plain._streams.norms[seed]
    assert threads and all(name.startswith("privzo-prefetch") for name in threads)  # nothing redrawn here
    assert len(ahead._slots) + len(ahead._spare) == 2  # two slots, swapped step after step
    assert CHUNK < _Bag().emb.weight.numel()


def test_a_prefetch_for_other_seeds_is_discarded():
    """Prefetching step t+1 and then running another step (a resume, a retry) draws that step as usual
    and reuses the prefetch's slot; nothing accumulates."""
    plain = Directions(list(_Bag().parameters()), "gaussian")
    d = Directions(list(_Bag().parameters()), "gaussian")
    for seed in range(3):
        d.prefetch([seed + 100])
        with d.cached([seed]), plain.cached([seed]):
            assert _bitwise_equal(list(d.iter_tensors(seed)), list(plain.iter_tensors(seed)))
    d.prefetch([])  # waits for and drops the last one
    assert d._pending is None and len(d._slots) + len(d._spare) == 2


def test_prefetched_run_follows_the_same_trajectory(tiny_spec_dict):
    """Whole private loops, with and without prefetch, on the same noise and batches: identical."""
    from components import builders
    from components.randomness import private_generator
    import specs

    finals = []
    for prefetch in (False, True):
        spec_dict = dict(tiny_spec_dict, model={"kind": "mlp", "hidden": [400]},
                         estimator={"kind": "pazo_m", "queries": 2, "mix": 0.3, "public_batch_size": 8,
                                    "perturbation": "cache"},
                         execution={"backend": "local", "prefetch_directions": prefetch})
        spec = specs.spec_from_dict(spec_dict)
        data = builders.load_data(spec)
        resolved, _, _ = builders.resolve_privacy(spec, len(data.private))
        built = builders.build_loop(resolved, data, noise_generator=private_generator(1),
                                    sampling_generator=private_generator(2))
        assert built.loop.backend.prefetch_directions is prefetch
        built.loop.run(15)
        finals.append(_snapshot(built.model))
    assert _bitwise_equal(*finals)


class _Returns(torch.nn.Module):
    """Returns its own parameter (a view of the perturbed one while perturbed), alone or in a tuple."""

    def __init__(self, as_tuple):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(5))
        self.as_tuple = as_tuple

    def forward(self, x):
        return (self.w, x) if self.as_tuple else self.w


class _Pair(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = _Returns(False), _Returns(True)

    def forward(self, x):
        return self.a(x), self.b(x)[0]


@pytest.mark.parametrize("hooked", [False, True], ids=["own forward", "forward set on the instance"])
def test_an_output_that_is_a_perturbed_parameter_keeps_its_values(hooked):
    """b's perturbation reuses the scratch a gave back: a's output, its own perturbed parameter, is a copy
    (through the hooks too, for a module whose forward was already replaced on the instance)."""
    torch.manual_seed(0)
    model = _Pair()
    if hooked:
        model.a.forward = model.a.forward  # a forward on the instance: privzo leaves it and hooks around it
    d = Directions(list(model.parameters()), "gaussian")
    with torch.no_grad(), perturbed(model, d, 3, 0.5):
        a_out, b_out = model(torch.zeros(1))
    ua, ub = d.dense(3)
    assert torch.equal(a_out, torch.add(model.a.w.detach(), ua, alpha=0.5))
    assert torch.equal(b_out, torch.add(model.b.w.detach(), ub, alpha=0.5))


@pytest.mark.parametrize("kind", ["gaussian", "sphere", "rademacher"])
def test_the_chunked_streams_keep_the_generators_contract(kind):
    """Both generators implement one interface (``Streams``) with one contract; the Philox streams are
    checked against it in test_philox.py. The engine itself never names a generator: it takes the one
    ``streams_for`` picks."""
    import components.directions.engine as engine
    from components.directions.streams import ChunkStreams, PhiloxStreams
    from tests.components.streams_contract import check_the_contract, check_the_interface

    check_the_interface(PhiloxStreams)
    check_the_contract(lambda params: ChunkStreams(params, kind, 7.0), _Bag(), table=0)
    assert isinstance(Directions(list(_Bag().parameters()), kind)._streams, ChunkStreams)
    assert not hasattr(engine, "philox")
