"""Model kinds: the small CNN builds from its spec, initialises from the public seed only, and trains."""
import math

import pytest
import torch

import specs
from components import builders, models


def _cnn_spec(tiny, channels=(4, 8)):
    tiny["model"] = {"kind": "cnn", "channels": list(channels)}
    return specs.spec_from_dict(tiny)


def test_cnn_spec_builds_the_documented_layers(tiny_spec_dict):
    model = builders.build_model(_cnn_spec(tiny_spec_dict), 64, 10)
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.padding) for c in convs] == [
        (1, 4, (3, 3), (1, 1)), (4, 8, (3, 3), (1, 1))]
    fc = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert [(f.in_features, f.out_features) for f in fc] == [(8 * 4 * 4, 10)]
    assert model(torch.rand(5, 64)).shape == (5, 10)
    assert sum(p.numel() for p in model.parameters()) == (4 * 9 + 4) + (8 * 4 * 9 + 8) + (128 * 10 + 10)


def test_cnn_init_follows_torch_defaults(tiny_spec_dict):
    """Seeded and global-RNG-free like every model (test_loop); here: torch's default Conv2d bounds."""
    a = builders.build_model(_cnn_spec(tiny_spec_dict), 64, 10)
    for conv in (a[1], a[3]):  # torch's default Conv2d bounds: weight 1/sqrt(fan_in) (kaiming a=sqrt(5)), bias too
        fan_in = conv.in_channels * 9
        bound = 1.0 / math.sqrt(fan_in)
        assert conv.weight.abs().max() <= bound + 1e-7 and conv.bias.abs().max() <= bound + 1e-7
        assert conv.weight.abs().max() > 0.5 * bound  # drawn, not left empty or zero


def test_cnn_needs_square_images():
    with pytest.raises(ValueError, match="square"):
        models.cnn(30, 2, [4])


def test_cnn_trains_privately_through_the_loop(tiny_spec_dict):
    tiny_spec_dict["optimizer"]["steps"] = 5
    spec = _cnn_spec(tiny_spec_dict)
    data = builders.load_data(spec)
    resolved, _rate, eps = builders.resolve_privacy(spec, len(data.private))
    built = builders.build_loop(resolved, data)
    before = [p.detach().clone() for p in built.model.parameters()]
    built.loop.run(resolved.optimizer.steps)
    assert built.loop.tracker.steps == 5 and eps <= 2.0 * (1 + 1e-9)
    assert any(not torch.equal(x, p) for x, p in zip(before, built.model.parameters()))
