"""Sources and the public/private/test split."""
import numpy as np
import pytest

from components.data import fraction_split, load_sklearn
from components.data.split import SplitOverlapError, check_disjoint, class_ratios


@pytest.mark.parametrize("name", ["digits", "breast_cancer", "wine"])
def test_sklearn_sources_load_offline(name):
    table = load_sklearn(name)
    assert len(table) > 100 and table.features.dtype == np.float32
    assert len(set(table.row_fingerprints())) == len(table)  # duplicates dropped


def test_split_sizes_disjoint_and_seeded():
    table = load_sklearn("digits")
    a = fraction_split(table, public=0.04, test=0.2, imbalance=[1.0, 0.85], seed=0, scale="fixed")
    b = fraction_split(table, public=0.04, test=0.2, imbalance=[1.0, 0.85], seed=0, scale="fixed")
    c = fraction_split(table, public=0.04, test=0.2, imbalance=[1.0, 0.85], seed=1, scale="fixed")
    assert len(a.test) == round(0.2 * len(table))
    assert len(a.public) + len(a.private) + len(a.test) == len(table)
    assert 0.03 * len(table) < len(a.public) < 0.04 * len(table)
    assert a.fingerprints == b.fingerprints  # public seed reproduces the split
    assert a.fingerprints != c.fingerprints
    sets = [set(p.fingerprints) for p in (a.public, a.private, a.test)]
    assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])
    assert float(a.private.features.max()) <= 1.0  # digits scaled by its known range 16


def test_imbalance_ratios_shape_the_public_classes():
    table = load_sklearn("digits")
    data = fraction_split(table, public=0.3, test=0.2, imbalance=[1.0, 0.5], seed=0, scale="fixed")
    counts = np.bincount(data.public.labels, minlength=10)
    assert counts[0] > counts[9] * 1.5
    assert np.allclose(class_ratios([1.0, 0.85], 4), [1.0, 0.95, 0.9, 0.85])
    with pytest.raises(ValueError, match="give 2 values or 10"):
        class_ratios([1.0, 0.9, 0.8], 10)


def test_public_scaling_uses_public_rows_only():
    table = load_sklearn("wine")
    data = fraction_split(table, public=0.2, test=0.2, imbalance=None, seed=0, scale="public")
    assert np.allclose(data.public.features.mean(axis=0), 0, atol=1e-5)
    with pytest.raises(ValueError, match="no fixed scale"):
        fraction_split(table, public=0.2, test=0.2, imbalance=None, seed=0, scale="fixed")


def test_overlapping_content_is_refused():
    table = load_sklearn("wine")
    data = fraction_split(table, public=0.2, test=0.2, imbalance=None, seed=0, scale="none")
    leaked = type(data.test)(data.test.features, data.test.labels, data.test.fingerprints + data.private.fingerprints[:1])
    with pytest.raises(SplitOverlapError, match="private and test"):
        check_disjoint(type(data)(data.public, data.private, leaked, data.n_classes, data.n_features))
