"""``privzo audit`` of the theory families: O2NC over tree aggregation (specs/examples/p1_o2nc_001.yaml) and
KL-Spider over planned Gaussians (specs/examples/q1_kl_spider.yaml), on smaller copies of those examples.

Their runs are planned through the family as a real run is (sigma and every other auto resolved), the
canaries go through the family's own loop and mechanism, and the same power check holds: with the noise
off the claim is refuted. The audits run with seeded generators, so each test is deterministic."""
import copy
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import specs
from components import builders
from components.audit import audit, audit_many, default_runs
from components.audit import run as audit_run
from components.mechanisms.tree import TreeAggregation

ROOT = Path(__file__).resolve().parents[2]
PRIVZO = [sys.executable, "-m", "flows.cli"]


def _example(file: str, changes: dict) -> dict:
    data = yaml.safe_load((ROOT / "specs" / "examples" / file).read_text())
    for path, value in changes.items():
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node[key]
        node[last] = value
    return data


# p1_o2nc_001 on 1250 rows (1000 private): 500 steps of O2NC, trees of its period, sigma calibrated (9.45)
O2NC_TREE = _example("p1_o2nc_001.yaml", {"name": "audit-o2nc-tree", "data.source.rows": 1250})
# q1_kl_spider on 1500 rows at epsilon 1 (40 runs can refute at most 1.60; the example's 4 needs more)
KL_SPIDER = _example("q1_kl_spider.yaml", {"name": "audit-kl-spider", "data.source.rows": 1500,
                                           "privacy.epsilon": 1.0})


def _spec(data: dict):
    return specs.spec_from_dict(copy.deepcopy(data))


@pytest.fixture(scope="module")
def o2nc():
    spec = _spec(O2NC_TREE)
    return spec, builders.load_data(spec)


@pytest.fixture(scope="module")
def kl():
    spec = _spec(KL_SPIDER)
    return spec, builders.load_data(spec)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _generators(seed: int):
    return [torch.Generator().manual_seed(1000 * seed + k) for k in range(3)]


def _audit(case, noise_scale: float, seed: int = 0):
    spec, data = case
    inclusion, noise, sampling = _generators(seed)
    if default_runs(spec) > 1:
        return audit_many(spec, data, runs=40, noise_scale=noise_scale, inclusion_generator=inclusion,
                          noise_generator=noise, sampling_generator=sampling)
    return audit(spec, data, canaries=100, noise_scale=noise_scale, inclusion_generator=inclusion,
                 noise_generator=noise, sampling_generator=sampling)


def test_a_theory_family_is_planned_by_its_family_and_kl_is_audited_by_many_runs(o2nc, kl):
    # sigma, the clips and the schedule are 'auto' in both specs: resolved as a real run resolves them
    for spec, data in (o2nc, kl):
        assert spec.mechanism.noise_multiplier == "auto"
        resolved, _, claimed = builders.plan(spec, data)
        setup = audit_run.audit_setup(spec, data, 8, "none", None)
        assert setup.resolved.mechanism.noise_multiplier == pytest.approx(resolved.mechanism.noise_multiplier)
        assert setup.claimed == pytest.approx(claimed) and setup.theory
        assert len(setup.bg_y) + len(setup.slots) == len(data.private)  # the spec's N rows: slots and fillers
    # one slot's clipped gradient is the same vector in every full-batch release: one run cannot tell many apart
    assert default_runs(kl[0]) == 100 and default_runs(o2nc[0]) == 1


@pytest.mark.parametrize("case", ["o2nc", "kl"])
def test_the_white_box_view_is_exactly_what_the_family_releases(request, case):
    # noise off: every node of the tree (every release of the KL mechanism) minus its expectation is the sum of
    # its slots' templates times (z - 1/2), so the scores are A (z - 1/2) exactly, A the probe's own overlap
    spec, data = request.getfixturevalue(case)
    setup = audit_run.audit_setup(spec, data, 60 if case == "o2nc" else 6, "none", None)
    included = np.arange(len(setup.slots)) % 3 != 0
    built, probe = audit_run._probed_loop(setup, data, included, 0.0, *_generators(1)[1:])
    built.loop.run(setup.resolved.optimizer.steps)
    scale = np.abs(probe.overlap).max()
    assert probe.releases >= 10 and scale > 0 and (np.diag(probe.overlap) > 0).sum() >= 5
    assert np.allclose(probe.scores, probe.overlap @ (included - 0.5), atol=1e-9 * scale)
    assert probe.share_at_clip > 0.95  # the canaries are worst case: their vectors sit at the clip


@pytest.mark.parametrize("case", ["o2nc", "kl"])
def test_noise_off_is_refuted_in_each_family(request, case):
    result = _audit(request.getfixturevalue(case), noise_scale=0.0)
    # tree: 2.68 (45 of 45 guesses right) against 1.0; KL-Spider: every one of 40 runs right, 1.60
    assert result.white_box.epsilon_lower > result.claimed_epsilon and result.exceeds_claim
    assert result.method == ("many-runs" if case == "kl" else "one-run")


@pytest.mark.parametrize("case", ["o2nc", "kl"])
def test_the_mechanism_as_claimed_is_not_refuted(request, case):
    result = _audit(request.getfixturevalue(case), noise_scale=1.0)
    assert result.claimed_epsilon <= 1.0 + 1e-9 and not result.exceeds_claim


def test_the_broken_mechanisms_keep_their_claims_and_drop_or_shrink_their_noise():
    # noise off: the plain running sum of a period's increments, while the real tree still moves on
    tree = TreeAggregation(4, 2.0, 1.0, torch.Generator().manual_seed(0))
    off = audit_run.NoiseOff(tree)
    increments = [[torch.full((3,), float(k))] for k in range(1, 7)]
    released = [float(off.release_running_sum(t)[0][0]) for t in increments]
    assert released == [1.0, 3.0, 6.0, 10.0, 5.0, 11.0] and tree.position == 2
    # the KL mechanism scaled: each release's std times the scale, the exponential mechanism's noise too
    calls = []

    class Recorder:
        def release_mean(self, sums, std):
            calls.append(std)

        def release_choice(self, scores, scale):
            calls.append(scale)

    scaled = audit_run.ScaledNoise(Recorder(), 0.1)
    scaled.release_mean([torch.zeros(2)], 3.0)
    scaled.release_choice([1.0, 2.0], 5.0)
    assert calls == pytest.approx([0.3, 50.0])


def test_too_many_canaries_for_the_rows_the_plan_is_for_is_one_line(o2nc):
    spec, data = o2nc
    with pytest.raises(ValueError) as err:
        audit(spec, data, canaries=600)
    message = str(err.value)
    assert message.startswith("--canaries: 600 canaries are more than half of the spec's 1000 private rows")
    assert "\n" not in message


def _privzo(args, cwd, env=None, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run(PRIVZO + args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def test_a_theory_spec_without_a_private_mechanism_is_refused_in_one_line(tmp_path):
    spec = copy.deepcopy(O2NC_TREE)
    spec["mechanism"] = {"kind": "none"}
    spec.pop("privacy")
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = _privzo(["audit", str(path)], tmp_path)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "mechanism.kind: none claims no privacy" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]


@pytest.mark.e2e
@pytest.mark.parametrize("case, args", [(O2NC_TREE, ["--canaries", "40"]), (KL_SPIDER, ["--runs", "10"])],
                         ids=["o2nc-tree", "kl-spider"])
def test_the_command_audits_both_families_without_a_traceback(prefect_server, tmp_path, case, args):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(case))
    out = _privzo(["audit", str(path), *args, "--no-log"], tmp_path, env={"PREFECT_API_URL": prefect_server})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Traceback" not in out.stderr + out.stdout
    assert "| white-box |" in out.stdout and "| black-box |" in out.stdout
