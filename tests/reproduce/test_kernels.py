"""The rate experiments' kernel is privzo's code: it reproduces privzo's own loop to 1e-9, and a kernel that
leaves that trajectory is caught (tests/reproduce/test_command.py runs the command itself)."""
import dataclasses

import pytest

from reproduce import experiments as ex
from reproduce.kernel import KernelPlan


@pytest.mark.parametrize("label, start", [("002 private (coupled)", 0.2), ("002 private (coupled)", 0.03),
                                          ("002 private (paper, independent)", 0.03),
                                          ("001 private", 0.98), ("002 first-order", 0.2), ("002 first-order", 0.03),
                                          ("002 multi-pass first-order", None), ("002 multi-pass zeroth-order", None)])
def test_the_kernel_reproduces_privzos_trajectory_to_1e9(label, start):
    # E1's three series are matched by the command's smoke run (tests/flows); 002 here, and both from a start
    # within r of a kink (0, 1), where the kernel evaluates psi point by point rather than by its slope
    series = next(s for s in ex.series_of(["E1", "E2", "E3", "E4"], quick=True) if s.label == label)
    # the paper's independent directions: m = 12,376 per row at n = 300 (5.8e5 at 10^4)
    rows = {"E4": 125, "E2": 300 if "independent" in label else 1_500}.get(series.experiment, 1_500)
    found = ex.match(series, rows, start=start)
    assert found.steps > 2 * 38 and found.ok, found  # more than two periods of privzo's loop
    assert found.query_points <= 1e-9 and found.certificates <= 1e-9 and found.output <= 1e-9


def test_a_kernel_off_privzos_trajectory_is_caught(monkeypatch):
    series = ex.series_of(["E1"], quick=True)[0]
    honest = KernelPlan.from_spec
    # a learning rate off by one part in a million: invisible in any rate, caught by the trajectory check
    monkeypatch.setattr(KernelPlan, "from_spec", classmethod(
        lambda cls, spec, n=None: dataclasses.replace(honest(spec, n), lr=honest(spec, n).lr * (1 + 1e-6))))
    found = ex.match(series, 1_500)
    assert not found.ok and found.query_points > 1e-9


def test_slopes_are_least_squares_and_local():
    xs, ys = [1e4, 1e5, 1e6], [1.0, 10 ** -0.5, 0.1]
    assert ex.least_squares_slope(xs, ys) == pytest.approx(-0.5, abs=1e-12)
    assert ex.local_slopes(xs, ys) == pytest.approx([-0.5, -0.5], abs=1e-12)
    with pytest.raises(ValueError, match="unknown experiment 'E6'.*privzo reproduce kl"):
        ex.series_of(["E6"])


@pytest.mark.parametrize("experiment, label, rows", [("E6", "KL-Spider Q1 (mean_pl)", 1000),
                                                     ("E6", "adaptive noisy GD (mean_pl)", 1000),
                                                     ("E7", "PPM Q4 (abs_three_halves)", 100),
                                                     ("E9", "adaptive noisy GD + selection Q5", 4000)])
def test_the_kl_kernel_reproduces_privzos_loop_to_1e9(experiment, label, rows):
    """Paper 003's kernel against privzo's own loop (the door, the filter, the optimizer; E9 with the
    selection's Gumbel draws): every iterate and the output to 1e-9."""
    from reproduce import kl_kernel as kk

    series = next(s for s in kk.series_of([experiment], quick=True) if s.label == label)
    found = kk.match(series, rows)
    assert found.ok and found.steps >= 4, found


def test_a_kl_kernel_off_privzos_plan_is_caught(monkeypatch):
    from reproduce import kl_kernel as kk

    series = kk.series_of(["E7"], quick=True)[1]
    honest = kk.proximal_point
    # an inner step off by one part in a million: caught by the trajectory check
    monkeypatch.setattr(kk, "proximal_point", lambda plan, *a, **k: honest(
        dataclasses.replace(plan, weak_convexity=plan.weak_convexity * (1 + 1e-6)), *a, **k))
    found = kk.match(series, 100)
    assert not found.ok and found.iterates > 1e-9
