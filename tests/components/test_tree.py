"""Tree aggregation (components/mechanisms/tree.py): its nodes and counts against brute force, the noise
every prefix carries, what one changed row moves, and its accounting against closed forms."""
import math

import dp_accounting
import numpy as np
import pytest
import torch
from scipy import optimize, stats

from components.accountants import Accountant
from components.mechanisms.tree import (
    TreeAggregation,
    chain,
    node_count,
    node_counts,
    node_interval,
    released_nodes,
    tree_depth,
    tree_event,
)


def _brute_counts(period):
    nodes = [node_interval(b) for b in range(1, period + 1)]
    return [sum(lo <= i <= hi for lo, hi in nodes) for i in range(1, period + 1)]


@pytest.mark.parametrize("period", [1, 2, 3, 4, 5, 7, 8, 12, 100, 255, 256, 399])
def test_node_counts_match_brute_force_and_position_one_is_the_worst(period):
    counts = node_counts(period)
    assert counts == _brute_counts(period)
    assert counts[0] == tree_depth(period) == math.floor(math.log2(period)) + 1
    assert all(c <= tree_depth(period) - 1 for c in counts[1:])
    for p in range(1, period + 1):  # the chain's nodes cover [1, p] exactly, once each
        covered = sorted(i for b in chain(p) for i in range(node_interval(b)[0], node_interval(b)[1] + 1))
        assert covered == list(range(1, p + 1))


def test_the_studys_example_and_the_node_sets_of_paper_001():
    assert node_counts(8) == [4, 3, 3, 2, 3, 2, 2, 1]
    assert [node_interval(b) for b in chain(7)] == [(7, 7), (5, 6), (1, 4)]  # 001's NODE(7)
    assert [node_interval(b) for b in chain(8)] == [(1, 8)]
    # the study's claim against 001's 2 ln n: J exceeds it only for n in {1, 2, 4}
    assert [n for n in range(1, 200) if tree_depth(n) > 2 * math.log(n)] == [1, 2, 4]


def _releases(tree, increments):
    return [tree.release_running_sum([torch.as_tensor(v, dtype=torch.float64)])[0].numpy() for v in increments]


@pytest.mark.parametrize("period", [1, 2, 3, 4, 7, 8, 100])
def test_each_prefix_carries_popcount_node_noises(period):
    # E|TREE(p)|^2 = popcount(p) d std^2: 20 periods of zero increments of d = 2000 coordinates, std = 0.5
    # (independent coordinates: as strong as 4 x 10^4 scalar draws, for a fiftieth of the calls)
    draws, d, std = 20, 2000, 0.5
    tree = TreeAggregation(period, noise_multiplier=0.5, sensitivity=1.0,
                           generator=torch.Generator().manual_seed(1000 + period))
    positions = sorted({1, 2, 3, period} & set(range(1, period + 1)))
    sums = {p: 0.0 for p in positions}
    zero = [torch.zeros(d, dtype=torch.float64)]
    for _ in range(draws):
        for p in range(1, period + 1):
            out = tree.release_running_sum(zero)[0]
            if p in sums:
                sums[p] += float(out.pow(2).sum())
        assert tree.at_boundary  # a fresh tree each period
    for p in positions:
        expected = bin(p).count("1") * d * std ** 2
        # the sum of popcount(p) d squared normals: sd of the mean is expected sqrt(2 / (popcount d draws))
        band = 3 * expected * math.sqrt(2 / (bin(p).count("1") * d * draws))
        assert abs(sums[p] / draws - expected) <= band, (p, sums[p] / draws, expected)


def test_the_period_end_prefix_carries_noise():
    # the papers' TREE(t mod period) released the whole prefix at t = 0 mod period with none
    for period in (1, 2, 8, 16):
        tree = TreeAggregation(period, 1.0, 1.0, torch.Generator().manual_seed(period))
        ones = [np.ones(3)] * period
        for _ in range(3):  # three periods
            releases = _releases(tree, ones)
            assert not np.allclose(releases[-1], period * np.ones(3))


def test_the_release_is_the_running_sum_plus_its_chains_noise():
    period, d, sigma = 13, 5, 0.7
    rng = np.random.default_rng(0)
    increments = [rng.standard_normal(d) for _ in range(period)]
    releases = _releases(TreeAggregation(period, sigma, 1.0, torch.Generator().manual_seed(9)), increments)
    gen = torch.Generator().manual_seed(9)  # the same draws, one per position, in order
    xi = {b: sigma * torch.randn(d, generator=gen, dtype=torch.float64).numpy() for b in range(1, period + 1)}
    for p in range(1, period + 1):
        expected = np.sum(increments[:p], axis=0) + sum(xi[b] for b in chain(p))
        assert np.allclose(releases[p - 1], expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("period", [8, 13])
def test_changing_one_row_moves_exactly_its_nodes_each_by_at_most_delta(period):
    # two neighbouring datasets, the same noise: the node values behind the releases (a bijection of them)
    # differ in exactly the node_count(i) nodes holding position i, each by at most Delta
    d, delta = 6, 1.0
    rng = np.random.default_rng(period)
    base = [rng.standard_normal(d) for _ in range(period)]
    for i in range(1, period + 1):
        other = [v.copy() for v in base]
        change = rng.standard_normal(d)
        other[i - 1] = other[i - 1] + delta * change / np.linalg.norm(change) * rng.uniform(0.5, 1.0)
        a = released_nodes(_releases(TreeAggregation(period, 1.0, delta, torch.Generator().manual_seed(3)), base))
        b = released_nodes(_releases(TreeAggregation(period, 1.0, delta, torch.Generator().manual_seed(3)), other))
        moved = [k + 1 for k in range(period) if not np.allclose(a[k], b[k], rtol=0, atol=1e-12)]
        assert moved == [bb for bb in range(1, period + 1) if node_interval(bb)[0] <= i <= node_interval(bb)[1]]
        assert len(moved) == node_count(i, period)
        assert all(np.linalg.norm(a[k - 1] - b[k - 1]) <= delta + 1e-12 for k in moved)


def _gaussian_epsilon(mu, delta):
    """epsilon at delta of mu-GDP, the analytic Gaussian curve (Balle and Wang 2018)."""
    def gap(eps):
        return stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2) - delta
    return optimize.brentq(gap, 0.0, 100.0, xtol=1e-12)


@pytest.mark.parametrize("z, period, passes", [(2.0, 100, 1), (1.0, 8, 1), (3.0, 1000, 1), (4.0, 64, 3)])
def test_the_pld_epsilon_of_the_tree_event_is_the_analytic_gaussian_curve(z, period, passes):
    delta = 1e-5
    mu = math.sqrt(passes * tree_depth(period)) / z
    eps = Accountant("pld", "add_remove").epsilon(tree_event(z, period, passes), delta)
    assert eps == pytest.approx(_gaussian_epsilon(mu, delta), rel=2e-3)


@pytest.mark.parametrize("z, period, expected", [(2.0, 100, 6.5426), (1.0, 8, 10.7255), (3.0, 1000, 5.0239)])
def test_the_rdp_of_the_tree_event_is_dp_accountings_single_epoch_tree(z, period, expected):
    ours = Accountant("rdp", "replace_one").epsilon(tree_event(z, period), 1e-5)
    special = dp_accounting.rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_SPECIAL)
    special.compose(dp_accounting.SingleEpochTreeAggregationDpEvent(z, period))
    assert ours == pytest.approx(special.get_epsilon(1e-5), rel=1e-9)
    assert ours == pytest.approx(expected, abs=1e-4)  # the errata's figures


@pytest.mark.parametrize("call, message", [
    (lambda: TreeAggregation(0, 1.0, 1.0, torch.Generator()), "tree: period 0 must be >= 1"),
    (lambda: TreeAggregation(4, 0.0, 1.0, torch.Generator()), "tree: noise_multiplier and sensitivity"),
    (lambda: tree_event(1.0, 8, passes=0), "tree: passes 0 must be >= 1"),
    (lambda: node_count(9, 8), "tree: position 9 must be in 1..8"),
])
def test_bad_arguments_are_one_line(call, message):
    with pytest.raises(ValueError) as err:
        call()
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
