"""privacy.noise: secure: OpenDP's discrete Gaussian for the noise, exact Bernoulli draws from secrets for the
batches. Statistical checks allow 6 standard errors, so they cannot flake (one failure in ~10^9 runs)."""
import copy
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import specs
from components import builders, randomness
from components.data.sampling import FixedSizeSampler, PoissonSampler
from components.mechanisms import GaussianMechanism
from components.mechanisms.gaussian import GRID_BITS, inflated_std, round_to_grid, secure_grid_exponent
from components.randomness import SecureSource, noise_source, private_generator, secure_bernoulli
from specs import SpecError
from tests.conftest import TINY


def _secure(clip=1.0, sigma=1.0, queries=4, neighboring="add_remove"):
    return GaussianMechanism(clip, sigma, queries, neighboring, SecureSource())


def test_secure_release_has_the_declared_mean_and_std():
    mech = _secure(clip=0.5, sigma=1.3, queries=4)
    sums = torch.tensor([0.3, -1.7, 5.0, 1e-3], dtype=torch.float32)
    noise = torch.cat([mech.release_scalars(sums) - sums.double() for _ in range(2000)])  # 8000 draws
    n, std = len(noise), mech.std  # the grid's inflation adds ~1e-12 of it: invisible here
    assert abs(float(noise.mean())) < 6 * std / math.sqrt(n)
    assert abs(float(noise.var()) / std**2 - 1) < 6 * math.sqrt(2 / n)


def test_secure_noise_never_repeats_across_two_mechanisms():
    a, b = _secure(), _secure()
    sums = torch.zeros(4)
    drawn = torch.cat([m.release_scalars(sums) for m in (a, b) for _ in range(32)])
    assert len(set(drawn.tolist())) == len(drawn)  # two draws on a grid of std * 2^-40 never coincide
    assert a.noise_source == b.noise_source == "secure"


def test_a_forked_process_never_uses_the_draws_its_parent_holds(monkeypatch):
    pool = randomness.SecureGaussianPool(1.0, -41, block=8)
    pool.take(2)
    held = set(pool._ready.tolist())
    assert len(held) == 6
    monkeypatch.setattr(randomness.os, "getpid", lambda: -1)  # as in a child after fork
    assert not held & set(pool.take(6).tolist())


def test_release_is_the_rounded_input_plus_a_draw_on_the_grid():
    mech = _secure(clip=0.25, sigma=2.0, queries=2)
    k = secure_grid_exponent(mech.std)
    sums = torch.tensor([0.123456789, -3.5e-7], dtype=torch.float64)
    released = mech.release_scalars(sums)
    steps = (released - round_to_grid(sums, k)) / math.ldexp(1.0, k)
    assert torch.equal(steps, steps.round())  # both terms on the grid: the float sum is exact


def test_rounding_moves_a_release_at_most_half_a_grid_step_and_the_std_covers_it():
    for std in (1e-6, 0.37, 2.0, 1234.5):
        k = secure_grid_exponent(std)
        grid = Fraction(2) ** k
        assert grid <= Fraction(std) * Fraction(2) ** -GRID_BITS < 2 * grid
        x = torch.randn(1000, dtype=torch.float64) * std * 10
        rounded = round_to_grid(x, k)
        assert all(abs(Fraction(float(r)) - Fraction(float(v))) <= grid / 2 for r, v in zip(rounded, x))
        assert all(Fraction(float(r)) / grid == int(Fraction(float(r)) / grid) for r in rounded)
        # neighbours at most `sens` apart are at most sens + sqrt(d) * grid apart once rounded, and the
        # inflated std is at least the nominal one times that ratio (sqrt(d) bounded above exactly)
        for sens, dims in ((0.25, 1), (1.0, 4), (0.5, 10**6 + 1), (1e3, 7)):
            inflated = inflated_std(std, sens, dims, k)
            # inflated >= std (sens + sqrt(dims) grid) / sens, squared to stay in exact rationals
            extra = (Fraction(inflated) / Fraction(std) * Fraction(sens) - Fraction(sens)) / grid
            assert extra > 0 and extra * extra >= dims
            # and only just: the bound, plus the ulp that rounding up may add
            assert inflated <= std * (1 + 2 * math.sqrt(dims) * 2.0**-GRID_BITS * std / sens) * (1 + 2.0**-51)


def test_secure_dense_and_embedded_releases_keep_shapes_and_dtypes():
    mech = _secure(clip=1.0, sigma=1.0, queries=1)
    tensors = [torch.zeros(3, 5), torch.ones(7, dtype=torch.float64)]
    out = mech.release_vector(tensors)
    assert [(t.shape, t.dtype) for t in out] == [(t.shape, t.dtype) for t in tensors]
    assert all(bool((o != t).all()) for o, t in zip(out, tensors))
    emb, residual = mech.release_embedded(torch.zeros(4), [torch.zeros(2, 3)], residual_clip=0.2, embedding_share=0.5)
    assert emb.shape == (4,) and emb.dtype == torch.float64 and residual[0].shape == (2, 3)


def test_secure_poisson_inclusion_frequency_matches_the_rate():
    n, steps = 1384, 300
    sampler = PoissonSampler(n, 64, 1384, SecureSource())
    joined = sum(len(sampler.sample()) for _ in range(steps))
    trials, p = n * steps, sampler.rate
    assert abs(joined / trials - p) < 6 * math.sqrt(p * (1 - p) / trials)


def test_exact_bernoulli_resolves_ties_with_the_rates_further_bits(monkeypatch):
    """Force every draw's first 16 bits onto the rate's: the row then joins with the probability of the
    rest of the expansion, (rate * 2^16) mod 1."""
    rate = 1 / 3
    head = int(Fraction(rate) * 2**16)
    monkeypatch.setattr(randomness.secrets, "token_bytes", lambda k: np.full(k // 2, head, dtype="<u2").tobytes())
    n = 4000
    frac = float(Fraction(rate) * 2**16 - head)
    share = secure_bernoulli(n, rate).mean()
    assert abs(share - frac) < 6 * math.sqrt(frac * (1 - frac) / n)


def test_exact_bernoulli_edges():
    assert secure_bernoulli(500, 1.0).all()
    assert not secure_bernoulli(500, 0.0).any()
    with pytest.raises(ValueError, match="rate"):
        secure_bernoulli(3, 1.5)


def test_secure_fixed_size_batches_are_uniform_subsets():
    n, size, steps = 20, 5, 4000
    sampler = FixedSizeSampler(n, size, SecureSource())
    counts = torch.zeros(n)
    for _ in range(steps):
        batch = sampler.sample()
        assert len(batch) == size and len(set(batch.tolist())) == size and torch.equal(batch, batch.sort().values)
        counts[batch] += 1
    p = size / n
    assert float((counts / steps - p).abs().max()) < 6 * math.sqrt(p * (1 - p) / steps)


@pytest.mark.parametrize("kind", ["two_point", "pazo_m", "pazo_p", "pazo_s", "dpgd_0th", "first_order", "gep"])
def test_auto_noise_per_estimator_and_step_size(kind):
    scalar = kind in ("two_point", "pazo_m", "pazo_p", "pazo_s")
    big, small = randomness.SECURE_MIN_ROW_PARAMETERS, randomness.SECURE_MIN_ROW_PARAMETERS - 1
    assert noise_source("auto", kind, private=True, insecure=False, row_parameters=big) == (
        "secure" if scalar else "fast")
    assert noise_source("auto", kind, private=True, insecure=False, row_parameters=small) == "fast"
    assert noise_source("auto", kind, private=True, insecure=False, row_parameters=64 * 9610) == "fast"  # digits
    assert noise_source("fast", kind, private=True, insecure=False, row_parameters=big) == "fast"
    assert noise_source("secure", kind, private=True, insecure=False, row_parameters=1) == "secure"
    assert noise_source("auto", kind, private=True, insecure=True, row_parameters=big) == "seeded"  # insecure wins
    assert noise_source("auto", kind, private=False, insecure=False, row_parameters=big) == "fast"  # no mechanism


@pytest.fixture(scope="module")
def digits():
    """The tiny digits spec, its data and its resolved form, once for the module (calibration takes seconds)."""
    spec = specs.spec_from_dict(copy.deepcopy(TINY))
    data = builders.load_data(spec)
    return builders.resolve_privacy(spec, len(data.private))[0], data


def _loop(digits, kwargs=None, **privacy):
    resolved, data = digits
    variant = resolved.model_copy(update={"privacy": resolved.privacy.model_copy(update=privacy)})
    return builders.build_loop(variant, data, **(kwargs or {})).loop


def test_build_loop_follows_privacy_noise(digits):
    assert digits[0].privacy.noise == "auto" and digits[0].estimator.kind == "two_point"
    assert _loop(digits).mechanism.noise_source == "fast"  # auto: 64 rows x a linear model's 650 parameters
    loop = _loop(digits, noise="secure")
    assert loop.mechanism.noise_source == "secure" and isinstance(loop.sampler._generator, SecureSource)
    loop.run(2)
    assert len(loop.released) == 2
    wide = digits[0].model_copy(update={"model": specs.spec_from_dict(
        {**copy.deepcopy(TINY), "model": {"kind": "mlp", "hidden": [2048]}}).model})
    assert builders.build_loop(wide, digits[1]).loop.mechanism.noise_source == "secure"  # 64 x 153,610


def test_injected_generators_bypass_secure_noise(digits):
    noise, batches = private_generator(1), private_generator(2)
    loop = _loop(digits, {"noise_generator": noise, "sampling_generator": batches}, noise="secure")
    assert loop.mechanism.noise_source == "seeded" and not loop.mechanism.secure
    assert loop.mechanism._generator is noise and loop.sampler._generator is batches  # the torch path, as before


def test_the_spec_refuses_secure_noise_with_insecure_deterministic(tiny_spec_dict, digits):
    tiny = copy.deepcopy(tiny_spec_dict)
    tiny["privacy"].update(noise="secure", insecure_deterministic=True)
    with pytest.raises(SpecError) as err:
        specs.spec_from_dict(tiny)
    message = str(err.value)
    assert "\n" not in message and "privacy" in message and "noise: secure" in message
    assert "insecure_deterministic" in message
    # auto with insecure_deterministic: the seeded generators win
    assert _loop(digits, insecure_deterministic=True).mechanism.noise_source == "seeded"
