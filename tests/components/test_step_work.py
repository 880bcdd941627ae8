"""What one private two-point step costs in values drawn and passes over the weights, counted on the CPU: a
change that adds a draw or a pass fails here without timing anything (bench/decoder_step.py times the step).

Regenerate mode draws the direction three times (once for each perturbed forward, once for the update) and
reads the weights three times (writing x + lambda u and x - lambda u into scratch, then the update), MeZO's
in-place step four of each; cache mode draws it once. An embedding table is the exception: its forward
perturbs only the rows it looked up, drawn once for both points (the same ids), so the table is drawn twice
a step in regenerate mode and only the update reads it whole.
"""
import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import components.directions.chunks as chunks
import components.directions.streams as streams
from components.accountants import Accountant, PrivacyTracker
from components.directions import Directions, perturbation
from components.estimators import TwoPointEstimator
from components.mechanisms import GaussianMechanism
from components.optimizers import Sgd
from components.randomness import private_generator
from components.runtime import LocalBackend, PrivateLoop

VOCAB, WIDTH, OUTPUTS, BATCH = 64, 48, 4096, 4
# ops that pass over a tensor element by element: the perturbation's writes and the update
ELEMENTWISE = {torch.ops.aten.add, torch.ops.aten.add_, torch.ops.aten.sub, torch.ops.aten.sub_, torch.ops.aten.mul,
               torch.ops.aten.mul_, torch.ops.aten.copy_, torch.ops.aten.lerp_, torch.ops.aten.addcmul_}


class _Decoder(nn.Module):
    """A table (one chunk), two layers, and a head large enough to be perturbed a block of rows at a time."""

    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(2))
        self.head = nn.Linear(WIDTH, OUTPUTS, bias=False)

    def forward(self, ids):
        h = self.table(ids).mean(dim=1)
        for layer in self.layers:
            h = torch.tanh(layer(h))
        return self.head(h)


class _Batch:
    expected_batch_size = BATCH

    def sample(self):
        return torch.arange(BATCH)


class _WeightReads(TorchDispatchMode):
    """Elements of the weights that elementwise ops read (a view of a weight counts as the weight)."""

    def __init__(self, params):
        super().__init__()
        self.spans = [(p.data_ptr(), p.data_ptr() + p.numel() * p.element_size()) for p in params]
        self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in ELEMENTWISE:
            for a in args:
                if isinstance(a, torch.Tensor) and any(lo <= a.data_ptr() < hi for lo, hi in self.spans):
                    self.elements += a.numel()
                    break
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("cache", [False, True], ids=["regenerate", "cache"])
def test_a_step_draws_and_passes_over_the_weights_as_often_as_its_mode_says(cache, monkeypatch):
    monkeypatch.setattr(perturbation, "SPLIT_MIN", 1 << 14)  # this head (131,072 weights) is split, as an LM's
    torch.manual_seed(0)
    model = _Decoder()
    params = list(model.parameters())
    d = Directions(params, "gaussian")
    assert perturbation._split_rows(model, d.index_of), "the head must take the block-of-rows path"
    ids = torch.randint(0, VOCAB, (BATCH, 6), generator=torch.Generator().manual_seed(1))
    labels = torch.randint(0, OUTPUTS, (BATCH,), generator=torch.Generator().manual_seed(2))
    mech = GaussianMechanism(1.0, 1.0, 1, "add_remove", private_generator(0))
    loop = PrivateLoop(LocalBackend(model, d, Sgd(d, lr=1e-3), ids, labels, cache_directions=cache), _Batch(),
                       TwoPointEstimator(1, 1e-3), mech, PrivacyTracker(Accountant("rdp"), mech.step_event(), 1e-5),
                       seed=0)
    loop.run(1)  # scratch and caches come with the first step

    drawn = []
    real = chunks.draw_seeded

    def counting(kind, seed, out):
        drawn.append(out.numel())
        real(kind, seed, out)

    monkeypatch.setattr(streams, "draw_seeded", counting)
    monkeypatch.setattr(chunks, "draw_seeded", counting)
    reads = _WeightReads(params)
    with reads:
        loop.run(2)

    dim, table = d.dim, model.table.weight.numel()
    assert sum(drawn) == (dim if cache else 3 * dim - table)
    assert reads.elements == 2 * (dim - table) + dim
