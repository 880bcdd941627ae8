"""Person level (data.blocks.person): a step samples persons and clips each sampled person's summed rows, so
removing one person, all of their rows, moves every pre-noise release by at most the clip; with each row
clipped on its own (event level) a person with k rows moves it by up to k times the clip."""
import numpy as np
import pytest
import torch

import specs
from components.data.sampling import PersonSampler
from components.data.split import hashed_split
from components.data.table import Table
from components.queries import DENSE_QUERIES, VectorFiniteDifferences
from specs.traits import ESTIMATORS as TRAITS
from tests.components.test_estimator_contract import ESTIMATORS, _pre_noise, _release_vector, _same_query

ROWS_PER_PERSON = 3
PERSON_LEVEL = sorted(k for k in ESTIMATORS if TRAITS[k].person_level)


def _largest_move(tiny, kind, person_level: bool) -> float:
    """The largest change of a pre-noise release (per coordinate, or in L2 for a dense one) when the batch's
    first person is removed with all of their rows, relative to the clip. A person here is a row the batch
    drew, held ROWS_PER_PERSON times (one visit recorded thrice): their rows then push every release the
    same way, the worst case of clipping each row alone."""
    clip = 0.05

    def persons_rows(idx):
        return idx.repeat_interleave(ROWS_PER_PERSON)

    def drop_person(idx):
        return persons_rows(idx[1:])

    def prepare(built):
        if person_level:  # each row index is its own person, whose copies the backend sums before clipping
            built.loop.backend.inner._persons = torch.arange(built.loop.backend.inner.n_private)

    base, built = _pre_noise(tiny, kind, persons_rows, steps=1, prepare=prepare)
    other, _ = _pre_noise(tiny, kind, drop_person, steps=1, prepare=prepare)
    directions = built.loop.backend.directions
    moves = []
    for (q_a, a), (q_b, b) in zip(base, other):
        if not _same_query(q_a, q_b):
            continue
        diff = _release_vector(q_a, a, directions) - _release_vector(q_b, b, directions)
        dense = isinstance(q_a, (VectorFiniteDifferences,) + tuple(DENSE_QUERIES))
        moves.append(float(diff.norm()) if dense else float(diff.abs().max()))
    assert moves
    return max(moves) / clip


@pytest.mark.parametrize("kind", PERSON_LEVEL)
def test_removing_a_person_moves_each_release_by_at_most_the_clip(tiny_spec_dict, kind):
    assert _largest_move(tiny_spec_dict, kind, person_level=True) <= 1 + 1e-6


@pytest.mark.parametrize("kind", ["two_point", "first_order"])
def test_clipping_each_row_alone_lets_a_person_move_a_release_by_more(tiny_spec_dict, kind):
    """The check above fails for event-level clipping: a person's 3 rows, each clipped, move it by 3 clips."""
    assert _largest_move(tiny_spec_dict, kind, person_level=False) > 2.9


def test_the_person_sampler_draws_persons_at_the_declared_rate_with_all_their_rows():
    persons = np.repeat([f"p{i}" for i in range(400)], [1 + i % 3 for i in range(400)])
    sampler = PersonSampler(persons, expected_batch_size=40, persons_declared=500,
                            generator=torch.Generator().manual_seed(3))
    assert sampler.rate == pytest.approx(40 / 500) and sampler.n == 400
    counts = []
    for _ in range(200):
        rows = sampler.sample().numpy()
        drawn = set(persons[rows])
        # every row of a drawn person, and no row of another
        assert sorted(rows) == sorted(np.flatnonzero(np.isin(persons, list(drawn))))
        counts.append(len(drawn))
    assert np.mean(counts) == pytest.approx(400 * 40 / 500, rel=0.1)
    event = sampler.wrap(object())
    assert event.sampling_probability == pytest.approx(40 / 500)


def test_a_hashed_split_keeps_each_persons_rows_in_one_part():
    rng = np.random.default_rng(0)
    persons = np.repeat([f"p{i}" for i in range(300)], 3)
    table = Table("t", rng.normal(size=(900, 4)).astype(np.float32), rng.integers(0, 2, 900), 2, None,
                  persons=persons)
    data = hashed_split(table, public=0.2, test=0.2, imbalance=None, seed=1, scale="none")
    parts = [data.public, data.private, data.test]
    owners = {}
    for k, part in enumerate(parts):
        for p in part.persons:
            owners.setdefault(int(p), set()).add(k)
    assert all(len(v) == 1 for v in owners.values()) and len(owners) == 300
    assert sum(len(p) for p in parts) == 900


def _person_spec(tiny, **change):
    d = {**tiny, "data": {"source": {"kind": "file", "path": "visits.csv", "label": "digit",
                                     "classes": list(range(10))},
                          "split": {"kind": "hashed", "public": 0.1, "test": 0.2},
                          "blocks": {"arrival": "arrived", "period": "day", "person": "patient",
                                     "declared_persons": 20}},
         "privacy": {"epsilon": 1.0, "delta": 1e-5, "accountant": "rdp"},
         "sampling": {"kind": "poisson", "expected_batch_size": 8},
         "budget": {"dataset": "visits", "lifetime_epsilon": 4.0, "window": {"blocks": 3}}}
    for key, value in change.items():
        section, _, field = key.partition(".")
        d[section] = value if not field else {**d[section], field: value}
    return d


def test_person_level_n_counts_declared_persons_and_unsupported_parts_are_refused_in_one_line(tiny_spec_dict):
    spec = specs.spec_from_dict(_person_spec(tiny_spec_dict))
    assert spec.person_level and spec.data.declared_private_rows == 60  # 20 persons a block x 3 blocks
    refusals = {
        "estimator": ({"kind": "gep", "anchors": 3, "public_batch_size": 8}, "estimator.kind: gep has no person-level"),
        "sampling": ({"kind": "fixed_size", "batch_size": 8}, "sampling.kind: a person-level run samples persons"),
        "data.split": ({"kind": "column", "column": "flag"}, "data.split.kind: a person-level run splits by person"),
    }
    for key, (value, message) in refusals.items():
        with pytest.raises(ValueError, match=message):
            specs.spec_from_dict(_person_spec(tiny_spec_dict, **{key: value}))
    with pytest.raises(ValueError, match="declared_persons: a person-level block"):
        d = _person_spec(tiny_spec_dict)
        d["data"]["blocks"] = {"arrival": "arrived", "person": "patient", "declared_private_rows": 20}
        specs.spec_from_dict(d)


def test_a_ray_backend_sends_all_of_a_persons_rows_to_one_worker():
    """Data parallelism splits a batch by person, so each worker clips whole persons' sums."""
    from types import SimpleNamespace

    from components.queries import FiniteDifferences, Seeded
    from components.runtime.ray_backend import RayBackend

    backend = SimpleNamespace(workers=[0, 1, 2], parallelism="data", _persons=np.arange(40) // 4)
    batch = np.asarray([0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 36, 37, 38, 39])
    jobs, how = RayBackend._split(backend, FiniteDifferences((Seeded(1),), 1e-3), batch)
    assert how == "sum" and sorted(np.concatenate([part for _, _, part in jobs])) == sorted(batch)
    for _, _, part in jobs:
        persons = set(part // 4)
        assert all(set(np.flatnonzero(np.isin(batch // 4, [p]))) <= set(np.flatnonzero(np.isin(batch, part)))
                   for p in persons)
