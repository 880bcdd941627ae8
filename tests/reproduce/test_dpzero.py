"""DPZero's Figure 1 (privzo reproduce dpzero): the kernel reproduces privzo's own loop, the spectra are the paper's,
and every run's noise is what privzo's planner calibrates for its T full-batch releases."""
import math

import numpy as np
import pytest

from reproduce import dpzero_quadratic as dq


@pytest.mark.parametrize("method, spectrum, lr, clip", [("dpzero", "identity", 0.01, 3.0),
                                                        ("dpgd_0th", "inverse_sqrt", 0.003, 3.0),
                                                        ("dp_gd", "inverse", 0.3, 1.0)])
def test_the_kernel_reproduces_privzos_loop_to_1e9(method, spectrum, lr, clip):
    # d = 20: blocks of 16 steps, so 40 steps cross two block ends of the zeroth-order kernel
    found = dq.match(dq.MatchPoint(method, spectrum, 20, 300, 40, lr, clip))
    assert found.ok and found.iterates <= 1e-9 and found.output <= 1e-9, found
    assert 0.05 < found.clipped < 0.95, found  # the clip binds for some rows and not for others
    assert found.epsilon <= dq.EPSILON


def test_a_kernel_off_privzos_trajectory_is_caught(monkeypatch):
    # the noise std off by one part in a million, in the kernel only
    monkeypatch.setattr(dq.Runs, "std", property(lambda self: self.multiplier * 2.0 * self.clip * (1 + 1e-6)))
    found = dq.match(dq.MatchPoint("dpzero", "identity", 20, 300, 40, 0.01, 3.0))
    assert not found.ok and found.iterates > 1e-9


def test_the_sorted_clipped_sums_are_the_direct_ones():
    rng = np.random.default_rng(0)
    v = rng.normal(size=501)
    ordered = np.sort(v)
    prefix = np.concatenate([[0.0], np.cumsum(ordered)])
    c, bound = rng.normal(size=40) * 2, rng.uniform(0.01, 3, size=40)
    direct = np.clip(c[:, None] - v[None, :], -bound[:, None], bound[:, None]).sum(axis=1)
    assert np.allclose(dq._clipped_sums(ordered, prefix, c, bound), direct, rtol=1e-12, atol=1e-9)


def test_the_spectra_are_the_papers():
    for spectrum in dq.SPECTRA:
        assert dq.hessian_diagonal(spectrum, 50).max() == 1.0  # ||A|| = 1, so r = Tr(A)
    assert dq.effective_rank("identity", 2000) == 2000
    assert dq.hessian_diagonal("inverse_sqrt", 4)[3] == pytest.approx(0.5)
    assert dq.effective_rank("inverse_sqrt", 2000) == pytest.approx(2 * math.sqrt(2000) - 1.4604, abs=0.02)
    assert dq.effective_rank("inverse", 2000) == pytest.approx(math.log(2000) + 0.5772, abs=0.01)
    with pytest.raises(ValueError, match="unknown spectrum 'diag'; allowed: identity, inverse_sqrt, inverse"):
        dq.hessian_diagonal("diag", 3)
    with pytest.raises(ValueError, match="unknown experiment 'E1'"):
        dq.spectra_of(["E1"])
    grid = dq.grid_of()
    assert grid.steps["dpzero"] == dq.PAPER_STEPS and grid.lrs["dpgd_0th"] == dq.PAPER_LRS
    assert set(grid.steps["dp_gd"]) <= set(dq.PAPER_STEPS) and set(grid.lrs["dp_gd"]) <= set(dq.PAPER_LRS)


@pytest.mark.parametrize("steps", [10, 640])
def test_the_noise_is_privzos_planner_calibration(steps):
    """sigma for T full-batch releases under replace-one is what privzo's planner resolves for such a spec, and its
    epsilon meets the target."""
    import specs
    from components import builders
    from reproduce.experiments import EXAMPLES

    data = specs.load_spec(EXAMPLES / "digits_dp_gd_full_batch.yaml").model_dump(mode="json")
    data["privacy"] = {"epsilon": dq.EPSILON, "delta": dq.DELTA, "accountant": dq.ACCOUNTANT,
                       "neighboring": dq.NEIGHBORING}
    data["optimizer"] = {"kind": "sgd", "lr": 1.0, "steps": steps}
    resolved, _, eps = builders.resolve_privacy(specs.spec_from_dict(data), n_private=2000)
    assert dq.noise_multiplier(steps, 2000) == pytest.approx(float(resolved.mechanism.noise_multiplier), rel=1e-12)
    assert dq.planned_epsilon(steps, 2000) == pytest.approx(eps, rel=1e-12) and eps <= dq.EPSILON
    runs = dq.Runs.of("dpzero", [(steps, 0.1, 3.0)], 2000)
    assert runs.std[0] == pytest.approx(2 * 3.0 * dq.noise_multiplier(steps, 2000))  # replace-one: sensitivity 2C
