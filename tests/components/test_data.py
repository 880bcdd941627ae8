"""Sources and the public/private/test split."""
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from components.data import Table, fraction_split, hashed_split, load_file, load_sklearn
from components.data.split import SplitOverlapError, check_disjoint, class_ratios
from tests.conftest import TINY, write_digits_file


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


# ---------------------------------------------------------------- the user's own files, and the hashed split
DIGITS = dict(label="digit", classes=list(range(10)))


def _hashed(table, seed=0, public=0.04, test=0.2, imbalance=(1.0, 0.85)):
    return hashed_split(table, public=public, test=test, imbalance=list(imbalance), seed=seed, scale="none")


def _parts(data):
    return {name: set(part.fingerprints) for name, part in
            (("public", data.public), ("private", data.private), ("test", data.test))}


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".jsonl", ".hf"])
def test_file_source_reads_the_rows_the_bundled_dataset_has(tmp_path, suffix):
    path = write_digits_file(tmp_path / f"digits{suffix}")
    table = load_file(path, file_format="auto", **DIGITS)
    bundled = load_sklearn("digits")
    assert table.features.dtype == np.float32 and table.n_classes == 10
    assert np.array_equal(table.features, bundled.features) and np.array_equal(table.labels, bundled.labels)
    assert table.columns == tuple(f"px{i}" for i in range(64))  # the model reads them in the file's order


def test_a_rows_identity_does_not_depend_on_the_files_column_order(tmp_path, tiny_spec_dict):
    """Re-exporting a file with its columns in another order must not re-draw the split: fingerprints read
    the columns sorted by name, and what they are read from (the layout) is the same."""
    import pandas as pd

    from components import builders

    path = write_digits_file(tmp_path / "clinic.csv")
    split = {"kind": "hashed", "public": 0.04, "test": 0.2}
    before = builders.load_data(_file_spec(tiny_spec_dict, path, split))
    frame = pd.read_csv(path)
    frame[list(reversed(frame.columns))].to_csv(path, index=False)
    after = builders.load_data(_file_spec(tiny_spec_dict, path, split))
    assert after.fingerprints == before.fingerprints and after.layout == before.layout
    frame.assign(site=3.0).to_csv(path, index=False)  # a new column: another identity, which the ledger refuses
    assert builders.load_data(_file_spec(tiny_spec_dict, path, split)).layout != before.layout


def test_file_source_maps_named_classes_in_the_declared_order(tmp_path):
    names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    path = write_digits_file(tmp_path / "named.csv", labels_as=dict(enumerate(names)))
    table = load_file(path, file_format="csv", label="digit", classes=names[::-1])
    assert np.array_equal(table.labels, 9 - load_sklearn("digits").labels)
    two = load_file(path, file_format="csv", label="digit", classes=names, features=["px10", "px20"])
    assert two.features.shape[1] == 2 and len(two) < len(table)  # rows equal on those columns are duplicates
    # a row is known by its class's name: declared in another order, or with a class added, every row
    # keeps its identity (and the ledger its record)
    reordered = load_file(path, file_format="csv", label="digit", classes=names + ["ten"])
    assert set(reordered.row_fingerprints()) == set(table.row_fingerprints()) and reordered.layout == table.layout
    # classes are declared, so a class absent from the file still has its output
    few = write_digits_file(tmp_path / "few.csv", rows=np.flatnonzero(load_sklearn("digits").labels < 3))
    assert load_file(few, file_format="csv", **DIGITS).n_classes == 10


def test_hf_disk_reads_a_split_of_a_dataset_dict_as_datasets_own_parquet_export_holds_it(tmp_path, tiny_spec_dict):
    """A DatasetDict folder: the chosen split's rows. A ClassLabel label is its code, as datasets' own
    to_parquet writes it, so a team that trained on that export and moves to the folder keeps every row's
    identity (and its ledger record and split); unlabelled rows (-1) are missing labels, not a class."""
    import datasets

    from components import builders
    from tests.conftest import save_to_disk

    names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    bundled = load_sklearn("digits")
    frame = pd.read_parquet(write_digits_file(tmp_path / "digits.parquet"))
    features = datasets.Features({**{f"px{i}": datasets.Value("float32") for i in range(64)},
                                  "digit": datasets.ClassLabel(names=names)})
    folder = save_to_disk(frame, tmp_path / "digits_dict", features, splits=["train", "validation"])
    table = load_file(folder, file_format="auto", label="digit", classes=list(range(10))[::-1], hf_split="validation")
    assert np.array_equal(table.features, bundled.features) and np.array_equal(table.labels, 9 - bundled.labels)
    exported = tmp_path / "export.parquet"
    datasets.load_from_disk(str(folder))["train"].to_parquet(str(exported))
    split = {"kind": "hashed", "public": 0.04, "test": 0.2}
    as_parquet = builders.load_data(_file_spec(tiny_spec_dict, exported, split))
    as_hf = builders.load_data(_file_spec(tiny_spec_dict, folder, split, hf_split="train"))
    assert as_hf.fingerprints == as_parquet.fingerprints and as_hf.layout == as_parquet.layout
    assert _parts(as_hf) == _parts(as_parquet)

    with pytest.raises(ValueError, match=r"^data.source.hf_split: digits_dict holds the splits train, validation; "
                                         r"choose one$"):
        load_file(folder, file_format="hf_disk", **DIGITS)
    with pytest.raises(ValueError, match=r"^data.source.hf_split: no split 'test' in digits_dict; splits: train, "
                                         r"validation$"):
        load_file(folder, file_format="auto", hf_split="test", **DIGITS)
    with pytest.raises(ValueError, match=r"^data.source.classes: column 'digit' is a ClassLabel, read by its codes "
                                         r"0..9 \(as datasets' own Parquet export holds it\); declare classes as"):
        load_file(folder, file_format="auto", label="digit", classes=names, hf_split="train")
    unlabelled = frame.assign(digit=frame.digit.where(frame.index != 5, -1))
    save_to_disk(unlabelled, tmp_path / "partly", features)
    with pytest.raises(ValueError, match=r"^data.source.label: column 'digit' has missing values$"):
        load_file(tmp_path / "partly", file_format="auto", **DIGITS)
    save_to_disk(frame.assign(digit=frame.digit.astype("float64").where(frame.index != 5)), tmp_path / "null",
                 datasets.Features({**features, "digit": datasets.Value("float64")}))
    with pytest.raises(ValueError, match=r"^data.source.label: column 'digit' has missing values$"):
        load_file(tmp_path / "null", file_format="auto", **DIGITS)


def test_hf_disk_reads_a_class_label_flag_by_name_and_drops_the_stored_pandas_index(tmp_path, tiny_spec_dict):
    """A ClassLabel public flag ['yes', 'no'] flags the 'yes' rows (its codes would flag the 'no' ones), and
    the index column Dataset.from_pandas stores for a filtered frame is not a feature, as pandas drops it
    from Parquet."""
    import datasets

    from components import builders

    datasets.disable_progress_bars()
    frame = pd.read_parquet(write_digits_file(tmp_path / "digits.parquet"))
    public = np.zeros(len(frame), dtype=bool)
    public[::10] = True
    frame["shared"] = np.where(public, "yes", "no")
    keep = frame.index % 7 != 0
    filtered = frame[keep]  # an index with gaps, which from_pandas keeps as the column __index_level_0__
    folder = tmp_path / "flagged"
    stored = datasets.Dataset.from_pandas(filtered.assign(shared=(filtered.shared == "no").astype(int)))
    stored.cast_column("shared", datasets.ClassLabel(names=["yes", "no"])).save_to_disk(str(folder))
    assert "__index_level_0__" in datasets.load_from_disk(str(folder)).column_names
    table = load_file(folder, file_format="auto", public_flag="shared", **DIGITS)
    assert table.columns == tuple(f"px{i}" for i in range(64))
    assert int(table.public_flags.sum()) == int(public[keep].sum())
    data = builders.load_data(_file_spec(tiny_spec_dict, folder, {"kind": "column", "column": "shared", "test": 0.2}))
    assert len(data.public) == int(public[keep].sum())


def test_hf_disk_errors_name_the_field(tmp_path):
    one = write_digits_file(tmp_path / "one.hf")
    with pytest.raises(ValueError, match=r"^data.source.hf_split: one.hf holds one Dataset, not a DatasetDict; "
                                         r"remove hf_split$"):
        load_file(one, file_format="auto", hf_split="train", **DIGITS)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"^data.source.path: .*empty is not a folder written by save_to_disk"):
        load_file(tmp_path / "empty", file_format="auto", **DIGITS)
    csv = write_digits_file(tmp_path / "d.csv")
    with pytest.raises(ValueError, match=r"^data.source.path: .*d.csv is not a folder \(format hf_disk reads"):
        load_file(csv, file_format="hf_disk", **DIGITS)
    with pytest.raises(ValueError, match=r"^data.source.hf_split: d.csv is csv, not a save_to_disk folder"):
        load_file(csv, file_format="auto", hf_split="train", **DIGITS)
    import specs

    with pytest.raises(specs.SpecError, match="hf_split applies to format hf_disk only, not parquet"):
        specs.spec_from_dict({**TINY, "data": {
            "declared_private_rows": 1000, "source": {"kind": "file", "path": "x.parquet", "format": "parquet", "hf_split": "train", **DIGITS},
            "split": {"kind": "hashed", "public": 0.04, "test": 0.2}}})


def test_file_source_drops_exact_duplicate_rows(tmp_path):
    path = write_digits_file(tmp_path / "dup.csv", rows=[0, 1, 2, 1, 0])
    assert len(load_file(path, file_format="csv", **DIGITS)) == 3


@pytest.mark.parametrize("edit, match", [
    (lambda f: f.drop(columns="digit"), "data.source.label: no column 'digit' in bad.csv"),
    (lambda f: f.assign(px3=f.px3.astype(str) + "x"), "data.source.features: column 'px3' is not numeric"),
    (lambda f: f.assign(px5=f.px5.where(f.index != 7)), "data.source.features: column 'px5' has missing or"),
    (lambda f: f.assign(digit=f.digit.replace(9, 11)), r"data.source.classes: column 'digit' has labels not among"),
    (lambda f: f.assign(digit=f.digit.where(f.index != 3)), "data.source.label: column 'digit' has missing values"),
    (lambda f: f.iloc[:0], "data.source.path: .*bad.csv has no rows"),
])
def test_file_source_errors_name_the_field(tmp_path, edit, match):
    import pandas as pd

    path = write_digits_file(tmp_path / "bad.csv")
    edit(pd.read_csv(path)).to_csv(path, index=False)
    with pytest.raises(ValueError, match=match):
        load_file(path, file_format="auto", **DIGITS)


def test_file_source_errors_for_the_path_and_format(tmp_path):
    with pytest.raises(ValueError, match="data.source.path: .*missing.csv is not a file"):
        load_file(tmp_path / "missing.csv", file_format="auto", **DIGITS)
    with pytest.raises(ValueError, match="data.source.format: cannot tell the format of 'rows.txt'"):
        load_file(tmp_path / "rows.txt", file_format="auto", **DIGITS)
    (tmp_path / "rows.parquet").write_text("not parquet")
    with pytest.raises(ValueError, match="data.source.path: cannot read .*rows.parquet as parquet"):
        load_file(tmp_path / "rows.parquet", file_format="auto", **DIGITS)
    with pytest.raises(ValueError, match="data.source.features: no column 'pixel'"):
        load_file(write_digits_file(tmp_path / "ok.csv"), file_format="csv", features=["pixel"], **DIGITS)


def test_hashed_split_sizes_disjoint_and_seeded():
    table = load_sklearn("digits")
    a, b, c = _hashed(table, seed=0), _hashed(table, seed=0), _hashed(table, seed=1)
    n = len(table)
    assert len(a.public) + len(a.private) + len(a.test) == n
    # binomial sizes: within 4 standard deviations of the expected counts
    assert abs(len(a.test) - 0.2 * n) < 4 * np.sqrt(n * 0.2 * 0.8)
    expected_public = 0.8 * n * 0.04 * np.mean(np.linspace(1.0, 0.85, 10))
    assert abs(len(a.public) - expected_public) < 4 * np.sqrt(expected_public)
    assert a.fingerprints == b.fingerprints and a.fingerprints != c.fingerprints
    sets = list(_parts(a).values())
    assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])
    heavy = _hashed(table, public=0.3, imbalance=(1.0, 0.5))
    counts = np.bincount(heavy.public.labels, minlength=10)
    assert counts[0] > counts[9] * 1.5


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), data=st.data())
def test_hashed_split_never_moves_a_row_when_others_come_or_go(seed, data):
    """Scheduled retraining on data that grows: a row's part is a function of its content and the seed
    alone, so every row private in an earlier run is private now (the ledger refuses anything else)."""
    full = load_sklearn("digits")
    n = len(full)
    keep = data.draw(st.lists(st.integers(0, n - 1), min_size=50, max_size=400, unique=True))
    order = np.random.default_rng(seed).permutation(n)  # the grown file, in another row order
    earlier = _hashed(Table("d", full.features[keep], full.labels[keep], 10, None), seed=seed)
    later = _hashed(Table("d", full.features[order], full.labels[order], 10, None), seed=seed)
    for name, rows in _parts(earlier).items():
        assert rows <= _parts(later)[name], name
    # and a class's public rows do not depend on how many rows the other classes have
    no_threes = full.labels != 3
    without = _hashed(Table("d", full.features[no_threes], full.labels[no_threes], 10, None), seed=seed)
    assert set(without.public.fingerprints) == {fp for fp, y in zip(later.public.fingerprints, later.public.labels)
                                                if y != 3}


def _file_spec(tiny, path, split, **source):
    import specs

    tiny["data"] = {"declared_private_rows": 1000, "source": {"kind": "file", "path": str(path), **DIGITS, **source}, "split": split,
                    "declared_private_rows": 1385}
    return specs.spec_from_dict(tiny)


def test_column_split_makes_public_exactly_the_rows_the_owner_flagged(tmp_path, tiny_spec_dict):
    import pandas as pd

    from components import builders

    bundled = load_sklearn("digits")
    path = write_digits_file(tmp_path / "clinic.csv")
    frame = pd.read_csv(path)
    frame["consented"] = np.where(np.arange(len(frame)) % 25 == 0, "Yes", "no")
    frame.to_csv(path, index=False)
    data = builders.load_data(_file_spec(tiny_spec_dict, path, {"kind": "column", "column": "consented"}))
    fps = load_file(write_digits_file(tmp_path / "plain.csv"), file_format="csv", **DIGITS).row_fingerprints()
    assert data.n_features == 64  # the flag is not a feature
    assert set(data.public.fingerprints) == {fps[i] for i in range(len(fps)) if i % 25 == 0}
    rest = set(data.private.fingerprints) | set(data.test.fingerprints)
    assert rest == {fps[i] for i in range(len(fps)) if i % 25}
    assert abs(len(data.test) / len(rest) - 0.2) < 0.05
    # the same flags and seed on a prefix of the file: every row keeps its part
    frame.iloc[:900].to_csv(path, index=False)
    early = builders.load_data(_file_spec(tiny_spec_dict, path, {"kind": "column", "column": "consented"}))
    assert set(early.private.fingerprints) <= set(data.private.fingerprints)
    assert set(early.test.fingerprints) <= set(data.test.fingerprints)


def test_flag_column_values_are_read_strictly(tmp_path):
    import pandas as pd

    path = write_digits_file(tmp_path / "f.csv", rows=range(6))
    frame = pd.read_csv(path)
    for values, public in ([True, False, True, False, False, False], [0, 2]), ([1, 0, 0, 0, 0, 1], [0, 5]), \
            (["TRUE", "false", "no", "yes", "No", "0"], [0, 3]):
        frame.assign(ok=values).to_csv(path, index=False)
        table = load_file(path, file_format="csv", public_flag="ok", **DIGITS)
        assert np.flatnonzero(table.public_flags).tolist() == public and table.features.shape[1] == 64
    for values in (["y", "n", "n", "n", "n", "n"], [1, 0, 2, 0, 0, 0], [1, 0, None, 0, 0, 0]):
        frame.assign(ok=values).to_csv(path, index=False)
        with pytest.raises(ValueError, match="data.split.column: column 'ok' must hold true/false, yes/no or 1/0"):
            load_file(path, file_format="csv", public_flag="ok", **DIGITS)
    with pytest.raises(ValueError, match="data.split.column: no column 'consent'"):
        load_file(path, file_format="csv", public_flag="consent", **DIGITS)


def test_a_row_is_public_only_if_every_copy_of_it_was_flagged(tmp_path):
    import pandas as pd

    path = write_digits_file(tmp_path / "d.csv", rows=[0, 1, 2, 0, 1])
    pd.read_csv(path).assign(ok=[1, 1, 0, 0, 1]).to_csv(path, index=False)
    table = load_file(path, file_format="csv", public_flag="ok", **DIGITS)
    assert len(table) == 3 and table.public_flags.tolist() == [False, True, False]


def test_source_split_takes_every_row_of_the_public_source(tmp_path, tiny_spec_dict):
    from components import builders
    from components.data.split import SplitOverlapError

    bundled = load_sklearn("digits")
    fps = load_file(write_digits_file(tmp_path / "plain.csv"), file_format="csv", **DIGITS).row_fingerprints()
    main = write_digits_file(tmp_path / "private.csv", rows=range(1000))
    public = write_digits_file(tmp_path / "public.parquet", rows=range(1000, 1100))
    split = {"kind": "source", "public_source": {"kind": "file", "path": str(public), **DIGITS}}
    data = builders.load_data(_file_spec(tiny_spec_dict, main, split))
    assert set(data.public.fingerprints) == set(fps[1000:1100])
    assert set(data.private.fingerprints) | set(data.test.fingerprints) == set(fps[:1000])
    assert np.allclose(data.public.features.mean(axis=0), 0, atol=1e-5)  # scaled from the public rows
    # the bundled digits as public data for a file of digits: same rows, so the parts would overlap
    split["public_source"] = {"kind": "sklearn", "name": "digits"}
    with pytest.raises(SplitOverlapError, match="some rows appear in both public and private"):
        builders.load_data(_file_spec(tiny_spec_dict, main, split))
    split["public_source"] = {"kind": "file", "path": str(public), **DIGITS, "features": ["px1", "px2"]}
    with pytest.raises(ValueError, match=r"data.split.public_source: its feature columns are not the main source's "
                                         r"\(no 'px0'\)"):
        builders.load_data(_file_spec(tiny_spec_dict, main, split))
    # the same columns in another order are matched by name
    import pandas as pd

    frame = pd.read_parquet(public)
    frame[list(reversed(frame.columns))].to_parquet(public)
    split["public_source"] = {"kind": "file", "path": str(public), **DIGITS}
    swapped = builders.load_data(_file_spec(tiny_spec_dict, main, split))
    assert np.array_equal(swapped.public.features, data.public.features)
    # a public source without column names (bundled) is fingerprinted as the main source is: overlap found
    split["public_source"] = {"kind": "sklearn", "name": "digits"}
    with pytest.raises(SplitOverlapError, match="some rows appear in both public and private"):
        builders.load_data(_file_spec(tiny_spec_dict, main, split))
    # dropping the main source's rows that the public source has: here every row, so nothing is private
    split["shared_rows"] = "drop_private"
    with pytest.raises(ValueError, match="no private rows left"):
        builders.load_data(_file_spec(tiny_spec_dict, main, split))
    overlapping = write_digits_file(tmp_path / "overlap.csv", rows=range(950, 1100))
    split["public_source"] = {"kind": "file", "path": str(overlapping), **DIGITS}
    dropped = builders.load_data(_file_spec(tiny_spec_dict, main, split))
    assert set(dropped.private.fingerprints) | set(dropped.test.fingerprints) == set(fps[:950])


def test_features_under_two_labels_are_dropped_whole(tmp_path):
    """Such a row has no single label, and its copies could land in two splits."""
    import pandas as pd

    path = write_digits_file(tmp_path / "c.csv", rows=[0, 1, 2, 3])
    frame = pd.read_csv(path)
    pd.concat([frame, frame.iloc[[1]].assign(digit=7)]).to_csv(path, index=False)
    table = load_file(path, file_format="csv", **DIGITS)
    assert table.labels.tolist() == [0, 2, 3]


@pytest.mark.parametrize("edit, match", [
    (lambda f: f.assign(px4=f.px4.astype(float).where(f.index != 5, 1e39)), "beyond float32's range"),
])
def test_values_beyond_float32_are_refused(tmp_path, edit, match):
    import pandas as pd

    path = write_digits_file(tmp_path / "big.csv", rows=range(20))
    edit(pd.read_csv(path)).to_csv(path, index=False)
    with pytest.raises(ValueError, match=f"data.source.features: column 'px4' .*{match}"):
        load_file(path, file_format="csv", **DIGITS)


def test_csv_headers_and_labels_are_read_as_written(tmp_path):
    (tmp_path / "dup.csv").write_text("a,b,y,y\n1,2,x,x\n3,4,z,z\n")
    with pytest.raises(ValueError, match="data.source.path: dup.csv has the column 'y' more than once"):
        load_file(tmp_path / "dup.csv", file_format="csv", label="y", classes=["x", "z"])
    (tmp_path / "codes.csv").write_text("a,b,y\n1,2,01\n3,4,02\n5,6,01\n")
    table = load_file(tmp_path / "codes.csv", file_format="csv", label="y", classes=["01", "02"])
    assert table.labels.tolist() == [0, 1, 0]
    (tmp_path / "floats.csv").write_text("a,b,y\n1,2,1.0\n3,4,0.0\n")
    assert load_file(tmp_path / "floats.csv", file_format="csv", label="y", classes=[0, 1]).labels.tolist() == [1, 0]


def test_a_public_source_error_names_the_public_source(tmp_path, tiny_spec_dict):
    from components import builders

    main = write_digits_file(tmp_path / "main.csv", rows=range(300))
    split = {"kind": "source", "public_source": {"kind": "file", "path": str(tmp_path / "nope.csv"), **DIGITS}}
    with pytest.raises(ValueError, match=r"^data.split.public_source.path: .*nope.csv is not a file"):
        builders.load_data(_file_spec(tiny_spec_dict, main, split))


def test_a_column_split_without_flagged_or_private_rows_says_so(tmp_path, tiny_spec_dict):
    import pandas as pd

    from components import builders
    from components.randomness import private_generator

    path = write_digits_file(tmp_path / "f.csv", rows=range(300))
    frame = pd.read_csv(path)
    frame.assign(ok="yes").to_csv(path, index=False)
    with pytest.raises(ValueError, match="^data.split: no private rows left: every row went to the public or test"):
        builders.load_data(_file_spec(tiny_spec_dict, path, {"kind": "column", "column": "ok"}))
    frame.assign(ok="no").to_csv(path, index=False)
    tiny_spec_dict["estimator"] = {"kind": "pazo_m", "queries": 1}
    spec = _file_spec(tiny_spec_dict, path, {"kind": "column", "column": "ok"}, scale="none")
    data = builders.load_data(spec)
    resolved, _, _ = builders.resolve_privacy(spec, len(data.private))
    with pytest.raises(ValueError, match="needs public rows and no row is flagged public in column 'ok'"):
        builders.build_loop(resolved, data, noise_generator=private_generator(1), sampling_generator=private_generator(2))
