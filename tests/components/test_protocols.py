"""Every part privzo builds satisfies the protocol the private loop relies on (components/protocols.py), and
each capability is present exactly where the loop expects it (docs/design.md, "One private step")."""
from __future__ import annotations

import copy

import pytest

import specs
from components import builders, registry
from components.protocols import (
    Backend,
    Certifying,
    CountsStarts,
    Estimator,
    Finalizing,
    FullBatchReleases,
    Mechanism,
    Optimizer,
    Periodic,
    PrivacyFilter,
    QueryReleases,
    RandomBatches,
    RemembersPreviousPoint,
    RequestsReleases,
    RunningSumReleases,
    Sampler,
    ScheduledBatches,
    SelfStopping,
    Tracker,
)
from components.randomness import private_generator
from tests.conftest import EXAMPLES, TINY

REPLACE_ONE = {**TINY["privacy"], "neighboring": "replace_one"}

# (spec section changes on TINY): every estimator, sampler, optimizer and Gaussian mechanism kind of the
# digits family, built as a run would build it
TINY_RUNS = {
    "two_point": {},
    "dpgd_0th": {"estimator": {"kind": "dpgd_0th", "queries": 2}},
    "pazo_m": {"estimator": {"kind": "pazo_m", "queries": 2, "public_batch_size": 8}},
    "pazo_p": {"estimator": {"kind": "pazo_p", "queries": 2, "public_batches": 3, "public_batch_size": 8}},
    "pazo_s": {"estimator": {"kind": "pazo_s", "public_batches": 3, "public_batch_size": 8}},
    "first_order": {"estimator": {"kind": "first_order"}},
    "gep": {"estimator": {"kind": "gep", "anchors": 3, "public_batch_size": 8}},
    "dope_sgd": {"estimator": {"kind": "dope_sgd", "public_batch_size": 8}},
    "pda_dpmd": {"estimator": {"kind": "pda_dpmd", "public_batch_size": 8}},
    "mechanism_none": {"mechanism": {"kind": "none"}, "privacy": None},
    "fixed_size": {"sampling": {"kind": "fixed_size", "batch_size": 64}, "privacy": REPLACE_ONE},
    "full_batch": {"sampling": {"kind": "full_batch"}, "privacy": REPLACE_ONE},
    "adam": {"optimizer": {"kind": "adam", "lr": 0.01, "steps": 60}},
}

# (example, its private rows, section changes): the theory families' runs, on few rows
EXAMPLE_RUNS = {
    "tree": ("p1_o2nc_001", 600, {}),
    "noiseless_tree": ("p1_o2nc_001", 600, {"mechanism": {"kind": "none"}, "privacy": None}),
    "single_pass_gaussian": ("p1_o2nc_001_naive", 600, {}),
    "fo_spider": ("p1_o2nc_002_fo", 600, {}),
    "scheduled": ("p1_o2nc_002_multipass", 300, {}),
    "kl_spider": ("q1_kl_spider", 600, {}),
    "proximal_point": ("q4_proximal_point", 120, {}),
    "adaptive_noisy_gd": ("q5_adaptive_select", 200, {}),
}


def _tiny(changes: dict) -> specs.RunSpec:
    data = copy.deepcopy(TINY)
    data.update(copy.deepcopy(changes))
    return specs.spec_from_dict(data)


def _example(name: str, rows: int, changes: dict) -> specs.RunSpec:
    data = specs.load_spec(str(EXAMPLES / f"{name}.yaml")).model_dump(mode="json")
    data["data"]["source"]["rows"] = rows
    for section, values in changes.items():
        data[section] = values if values is None or "kind" in values else {**(data.get(section) or {}), **values}
    return specs.spec_from_dict(data)


def _build(spec: specs.RunSpec):
    data = builders.load_data(spec)
    resolved, _, _ = builders.plan(spec, data)
    return resolved, builders.build_loop(resolved, data, noise_generator=private_generator(11),
                                         sampling_generator=private_generator(12)).loop


@pytest.fixture(scope="module")
def loops():
    """Every run above, built once: {name: (resolved spec, loop)}."""
    built = {name: _build(_tiny(changes)) for name, changes in TINY_RUNS.items()}
    built.update({name: _build(_example(*run)) for name, run in EXAMPLE_RUNS.items()})
    return built


def test_the_runs_build_every_registered_kind(loops):
    """A kind added to a registry without a run here would go unchecked."""
    built = {section: {getattr(spec, section).kind for spec, _ in loops.values()}
             for section in ("estimator", "mechanism", "sampling", "optimizer")}
    for section, kinds in built.items():
        assert kinds == registry.ALL[section].kinds(), section


def test_every_part_satisfies_its_protocol(loops):
    for name, (_, loop) in loops.items():
        assert isinstance(loop.estimator, Estimator), name
        assert isinstance(loop.mechanism, Mechanism), name
        assert isinstance(loop.tracker, Tracker), name
        assert isinstance(loop.sampler, Sampler), name
        assert isinstance(loop.backend, Backend), name
        assert isinstance(loop.backend.optimizer, Optimizer), name


# each mechanism releases through exactly one family of release methods, named release*
RELEASES = {
    "GaussianMechanism": QueryReleases,
    "NoMechanism": QueryReleases,
    "TreeAggregation": RunningSumReleases,
    "ScheduledGaussian": RunningSumReleases,
    "NoiselessTree": RunningSumReleases,
    "FullBatchGaussian": FullBatchReleases,
}


def test_each_mechanism_releases_through_one_family_of_release_methods(loops):
    seen = set()
    for name, (_, loop) in loops.items():
        mechanism = loop.mechanism
        kind = type(mechanism).__name__
        families = {p for p in (QueryReleases, RunningSumReleases, FullBatchReleases) if isinstance(mechanism, p)}
        assert families == {RELEASES[kind]}, (name, kind)
        # the names before one vocabulary: none is left to release by another door
        assert not {"add", "vector", "norm", "select", "mean", "release", "release_dense"} & set(dir(mechanism)), kind
        seen.add(kind)
    assert seen == set(RELEASES)


# the capabilities each class has, and only those
CAPABILITIES = {
    "GaussianMechanism": set(),
    "NoMechanism": set(),
    "FullBatchGaussian": set(),
    "TreeAggregation": {Periodic},
    "ScheduledGaussian": {Periodic},
    "NoiselessTree": {Periodic},
    "PoissonSampler": {RandomBatches},
    "FixedSizeSampler": {RandomBatches},
    "FullBatchSampler": {RandomBatches},
    "SinglePassSampler": {ScheduledBatches},
    "Sgd": set(),
    "Adam": set(),
    "O2nc": {RemembersPreviousPoint, Finalizing, Certifying},
    "KlSpider": {SelfStopping, RequestsReleases},
    "ProximalPoint": {SelfStopping, RequestsReleases, Finalizing},
    "AdaptiveNoisyGd": {SelfStopping, RequestsReleases, Finalizing},
    "PrivacyTracker": set(),
    "OncePerRowTracker": set(),
    "TreeTracker": set(),
    "ScheduledTracker": {CountsStarts},
    "FilterTracker": {PrivacyFilter},
}
ALL_CAPABILITIES = (Periodic, RandomBatches, ScheduledBatches, SelfStopping, RequestsReleases,
                    RemembersPreviousPoint, Finalizing, Certifying, CountsStarts, PrivacyFilter)


def test_each_capability_is_present_exactly_where_expected(loops):
    seen = set()
    for name, (_, loop) in loops.items():
        for part in (loop.mechanism, loop.sampler, loop.backend.optimizer, loop.tracker):
            kind = type(part).__name__
            has = {c for c in ALL_CAPABILITIES if isinstance(part, c)}
            assert has == CAPABILITIES[kind], (name, kind, has)
            seen.add(kind)
    assert seen == set(CAPABILITIES)


def test_checkpoints_carry_the_counts_their_tracker_keeps_and_load_back(loops):
    """The checkpoint's extra counts follow the tracker's capabilities (the loop no longer probes names), and
    every kind of loop takes its own state back: the mechanism reset where it is periodic, the tracker
    aligned, the backend synchronised."""
    for name, (_, loop) in loops.items():
        state = loop.state_dict()
        assert ("privacy_starts" in state) == isinstance(loop.tracker, CountsStarts), name
        assert ("privacy_spent" in state) == isinstance(loop.tracker, PrivacyFilter), name
        steps = loop.tracker.steps
        loop.load_state_dict(state, restore_privacy_steps=True)
        assert loop.tracker.steps == steps and loop.step == state["step"], name


def test_only_a_single_pass_normalises_by_its_schedule(loops):
    """A ScheduledBatches sampler's sums are divided by its scheduled batch size, any other's by its
    expected batch size."""
    for name in ("tree", "two_point"):
        loop, seen = loops[name][1], []
        estimator = loop.estimator

        class Seeing:
            def __getattr__(self, attr):
                return getattr(estimator, attr)

            def step(self, ctx):
                seen.append(ctx.batch_normaliser)
                return estimator.step(ctx)

        loop.estimator = Seeing()
        try:
            first = loop.step
            loop.run(first + 2)
        finally:
            loop.estimator = estimator
        sampler = loop.sampler
        expected = ([sampler.batch_at(first), sampler.batch_at(first + 1)] if name == "tree"
                    else [sampler.expected_batch_size] * 2)
        assert seen == [float(b) for b in expected], name
    tree = loops["tree"][1].sampler
    assert tree.batch_at(0) == tree.start_batch != tree.expected_batch_size  # the schedule is what differs


@pytest.mark.e2e
def test_the_ray_backend_satisfies_the_backend_protocol(tiny_spec_dict):
    import ray

    from components.runtime.ray_backend import RayBackend
    from tests.conftest import fixed_loop, fresh_ray

    fresh_ray(1)
    try:
        tiny_spec_dict["execution"] = {"backend": "ray", "workers": 1}
        backend = fixed_loop(tiny_spec_dict).loop.backend
        try:
            assert isinstance(backend, RayBackend) and isinstance(backend, Backend)
            backend.sync()
        finally:
            backend.close()
    finally:
        ray.shutdown()
