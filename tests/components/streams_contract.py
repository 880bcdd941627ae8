"""What every direction generator (``components.directions.streams``) must do, checked on one instance: the
chunked streams in test_directions.py, the Philox streams in test_philox.py (where Triton can run)."""
import torch

from components.directions.streams import Streams


def interface():
    """The methods ``Directions`` may call on a generator: the abstract ones, and those ``Streams`` defines."""
    return {n for n in Streams.__abstractmethods__} | {n for n in vars(Streams) if not n.startswith("_")}


def check_the_interface(cls):
    """``cls`` implements every method of the interface and offers nothing more that a caller could use."""
    assert issubclass(cls, Streams) and not cls.__abstractmethods__
    extra = {n for n in vars(cls) if not n.startswith("_")} - interface()
    assert not extra, f"{cls.__name__} has methods outside the interface: {sorted(extra)}"


def _same_bits(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))


def check_the_contract(make, model: torch.nn.Module, table: int, seed: int = 3, scale: float = 0.37):
    """``make(params)`` builds a fresh generator over the model's parameters, tensor ``table`` an embedding
    table (2-D, several chunks or blocks). Every way of getting at direction ``seed`` gives the same values,
    bit for bit: a slot drawn for the prefetch or for a step, a tensor drawn alone, an embedding's rows; and
    every operation gives the same result with u drawn or read from a cache slot."""
    params = [p.detach() for p in model.parameters()]
    streams = make(params)
    check_the_interface(type(streams))
    assert isinstance(streams.name, str) and streams.name

    ahead, step = streams.new_slot(), streams.new_slot()
    norm = streams.draw_slot(seed, ahead)
    assert (norm is None) == (streams.kind != "sphere")
    streams.draw_slots([seed], [step])
    assert all(_same_bits(a, b) for a, b in zip(ahead, step))
    alone = make(params)  # nothing remembered: a sphere's norm by a pass of its own
    assert all(_same_bits(alone.tensor(seed, i), u) for i, u in enumerate(step))
    if norm is not None:
        assert streams.sphere_norm(seed) == alone.sphere_norm(seed) == norm

    ids = torch.tensor([0, 5, 6, params[table].shape[0] - 1], device=params[table].device)
    rows = torch.empty(len(ids), params[table].shape[1], device=params[table].device, dtype=params[table].dtype)
    alone.rows(seed, table, ids, rows)
    assert _same_bits(rows, step[table][ids])

    perturbed = []
    for i, p in enumerate(params):
        drawn, read = torch.empty_like(p), torch.empty_like(p)
        alone.perturb(seed, i, p, drawn, scale, None)
        streams.perturb(seed, i, p, read, scale, step[i])
        assert _same_bits(drawn, read)
        perturbed.append(drawn)
    width = params[table].shape[1]
    span = torch.empty(3 * width, device=rows.device, dtype=rows.dtype)
    source = params[table].reshape(-1)[2 * width:5 * width]
    alone.perturb_span(seed, table, params[table], source, 2 * width, 5 * width, span, scale)
    assert _same_bits(span, perturbed[table].reshape(-1)[2 * width:5 * width])
    assert _same_bits(streams.add_rows(params[table][ids], step[table][ids], scale), perturbed[table][ids])

    index = {id(p): i for i, p in enumerate(model.parameters())}
    owners = [(m, n, index[id(p)]) for m in model.modules() for n, p in m._parameters.items() if p is not None]
    views, tables = streams.swap_point(owners, params, step, scale)
    assert tables <= {table}
    assert all(_same_bits(views[i], perturbed[i]) for i in range(len(params)) if i not in tables)

    updated = []
    for u, whole in ((None, False), (step, False), (None, True), (step, True)):
        targets = [p.clone() for p in params]
        if whole:
            alone.add_all(seed, targets, -scale, u)
        else:
            for i, t in enumerate(targets):
                alone.add(seed, i, t, -scale, None if u is None else u[i])
        updated.append(targets)
    assert all(_same_bits(a, b) for other in updated[1:] for a, b in zip(updated[0], other))
    assert not _same_bits(updated[0][table], params[table])
