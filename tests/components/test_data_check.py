"""What `privzo validate` checks of a data source by its names alone (components/data_check.py): the path, the
format, the column names and the class folders, with the loaders' own messages, and without torch."""
import ast
import os
from pathlib import Path

import pandas as pd
import pytest

import specs
from components.data import load_file, load_images
from components.data_check import file_problems, images_problems, source_problems
from tests.conftest import TINY, save_to_disk

ROWS = pd.DataFrame({"a": [0.5, 1.5, 2.5, 3.5], "b": [1.0, 0.0, 2.0, 3.0], "y": ["no", "yes", "no", "yes"],
                     "ok": [1, 0, 1, 0]})
FILE = {"label": "y", "classes": ["no", "yes"]}


def _both(path, **settings):
    """(validate's problems, the loader's refusal or None) for one file source."""
    file_format = settings.pop("file_format", "auto")
    check = file_problems(path, file_format=file_format, **settings)
    try:
        load_file(path, file_format=file_format, classes=FILE["classes"], **settings)
        refusal = None
    except ValueError as err:
        refusal = str(err)
    return check, refusal


@pytest.mark.parametrize("write", [
    lambda p: ROWS.to_csv(p.with_suffix(".csv"), index=False),
    lambda p: ROWS.to_parquet(p.with_suffix(".parquet")),
    lambda p: ROWS.set_index("a").to_parquet(p.with_suffix(".pq")),  # a named index is read back as the index
    lambda p: ROWS.to_json(p.with_suffix(".jsonl"), orient="records", lines=True),
    lambda p: save_to_disk(ROWS, p.with_suffix(".hf")),
    lambda p: save_to_disk(ROWS, p.with_suffix(".dd"), splits=["train"]),
])
def test_a_good_file_passes_as_the_loader_reads_it(tmp_path, write):
    write(tmp_path / "rows")
    path = next(tmp_path.iterdir())
    assert _both(path, label="y") == ([], None)
    assert _both(path, label="y", public_flag="ok") == ([], None)


def test_a_missing_or_odd_path_is_named_as_the_loader_names_it(tmp_path):
    check, refusal = _both(tmp_path / "nope.csv", label="y")
    assert check == [refusal] == [f"data.source.path: {tmp_path / 'nope.csv'} is not a file (nothing is there)"]
    (tmp_path / "folder.csv").mkdir()
    check, refusal = _both(tmp_path / "folder.csv", label="y", file_format="csv")
    assert check == [f"data.source.path: {tmp_path / 'folder.csv'} is not a file (a folder)"]
    os.mkfifo(tmp_path / "pipe.csv")  # a named pipe: open() would wait for a writer; its type says enough
    check, refusal = _both(tmp_path / "pipe.csv", label="y")
    assert check == [refusal] == [f"data.source.path: {tmp_path / 'pipe.csv'} is not a file (not a regular file)"]
    check, refusal = _both(tmp_path / ("x" * 300 + ".csv"), label="y")  # the system refuses the name itself
    assert check == [refusal] and "cannot read" in refusal and "too long" in refusal
    (tmp_path / "empty").mkdir()
    check, refusal = _both(tmp_path / "empty", label="y")
    assert check == [refusal] and "empty is not a folder written by save_to_disk" in refusal
    (tmp_path / "rows.txt").write_text("a,y\n")
    assert "cannot tell the format of 'rows.txt'" in _both(tmp_path / "rows.txt", label="y")[0][0]
    (tmp_path / "bad.parquet").write_text("not parquet")
    check, refusal = _both(tmp_path / "bad.parquet", label="y")
    unreadable = f"data.source.path: cannot read {tmp_path / 'bad.parquet'} as parquet: "
    assert check[0].startswith(unreadable) and refusal.startswith(unreadable)  # pyarrow's own words may differ


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode bits say")
def test_a_file_without_read_permission_is_named(tmp_path):
    path = tmp_path / "locked.csv"
    ROWS.to_csv(path, index=False)
    path.chmod(0)
    check, refusal = _both(path, label="y")
    assert check == [refusal] == [f"data.source.path: cannot read {path} as csv: Permission denied"]


@pytest.mark.skipif(not Path("/proc/self/mem").is_file(), reason="Linux's /proc: a regular file whose read fails")
def test_a_file_whose_read_fails_is_named(tmp_path):
    """Read as root too (mode bits do not stop root): reading this process's memory at address 0 fails."""
    check, refusal = _both(Path("/proc/self/mem"), label="y", file_format="csv")
    assert check == [refusal] == ["data.source.path: cannot read /proc/self/mem as csv: Input/output error"]


def test_an_unnamed_or_repeated_column_is_refused_by_both(tmp_path):
    ROWS.to_csv(tmp_path / "index.csv")  # pandas' default writes the row index, under an empty header cell
    check, refusal = _both(tmp_path / "index.csv", label="y")
    assert check == [refusal] == ["data.source.path: column 1 of index.csv has no name; name every column, or drop it "
                                  "(pandas writes its index as one: to_csv(index=False))"]
    pd.read_csv(tmp_path / "index.csv").to_parquet(tmp_path / "index.parquet")  # re-exported: now 'Unnamed: 0'
    check, refusal = _both(tmp_path / "index.parquet", label="y")
    assert check == [refusal] and "column 1 of index.parquet has no name (it is called 'Unnamed: 0'" in refusal
    (tmp_path / "twice.csv").write_text("a,y,a\n1,no,2\n2,yes,3\n")
    check, refusal = _both(tmp_path / "twice.csv", label="y")
    assert check == [refusal] == ["data.source.path: twice.csv has the column 'a' more than once; rename one"]


@pytest.mark.parametrize("settings, problem", [
    ({"label": "label"}, "data.source.label: no column 'label' in rows.csv; columns: a, b, y, ok"),
    ({"label": "y", "features": ["a", "c"]}, "data.source.features: no column 'c' in rows.csv; columns: a, b, y, ok"),
    ({"label": "y", "public_flag": "shared"},
     "data.split.column: no column 'shared' in rows.csv; columns: a, b, y, ok"),
])
def test_a_column_the_spec_names_must_be_there(tmp_path, settings, problem):
    ROWS.to_csv(tmp_path / "rows.csv", index=False)
    check, refusal = _both(tmp_path / "rows.csv", **settings)
    assert check == [problem] and refusal == problem
    # every problem the names show, where the loader stops at its first
    ROWS[["y"]].to_csv(tmp_path / "rows.csv")
    assert file_problems(tmp_path / "rows.csv", file_format="auto", label="label", features=["a"]) == [
        "data.source.path: column 1 of rows.csv has no name; name every column, or drop it (pandas writes its index "
        "as one: to_csv(index=False))", "data.source.label: no column 'label' in rows.csv; columns: , y",
        "data.source.features: no column 'a' in rows.csv; columns: , y"]


def test_json_lines_and_save_to_disk_names_come_without_their_values(tmp_path):
    ROWS.to_json(tmp_path / "rows.jsonl", orient="records", lines=True)
    assert file_problems(tmp_path / "rows.jsonl", file_format="auto", label="topic") == [
        "data.source.label: no column 'topic' in the first row of rows.jsonl; columns: a, b, y, ok"]
    (tmp_path / "list.jsonl").write_text("[1, 2]\n")
    assert file_problems(tmp_path / "list.jsonl", file_format="auto", label="y") == [
        f"data.source.path: cannot read {tmp_path / 'list.jsonl'} as jsonl: its first line is a JSON list, not an "
        "object"]
    folder = save_to_disk(ROWS, tmp_path / "saved", splits=["train", "test"])
    check, refusal = _both(folder, label="y")
    assert check == [refusal] == ["data.source.hf_split: saved holds the splits train, test; choose one"]
    check, refusal = _both(folder, label="y", hf_split="dev")
    assert check == [refusal] == ["data.source.hf_split: no split 'dev' in saved; splits: train, test"]
    assert _both(folder, label="y", hf_split="test") == ([], None)
    assert file_problems(folder, file_format="auto", label="topic", hf_split="train") == [
        "data.source.label: no column 'topic' in saved; columns: a, b, y, ok"]


def test_an_image_folder_is_checked_by_its_names_as_the_loader_does(tmp_path):
    def both(classes):
        try:
            load_images(tmp_path / "scans", classes=classes, size=4, mode="L")
            refusal = None
        except ValueError as err:
            refusal = str(err)
        return images_problems(tmp_path / "scans", classes), refusal

    root = tmp_path / "scans"
    check, refusal = both(["normal", "benign"])
    assert check == [refusal] == [f"data.source.path: {root} is not a folder (expected one subfolder per class)"]
    (root / "normal").mkdir(parents=True)
    (root / "benign").mkdir()
    (root / "normal" / "x.png").write_bytes(b"not looked at")  # names only: no image is opened
    # a declared class without a folder has no rows, for the loader too; a misspelt one is an undeclared folder
    assert both(["normal", "benign", "malignant"])[0] == []
    (root / "Malignant").mkdir()
    check, refusal = both(["normal", "benign", "malignant"])
    assert check == [refusal] == [f"data.source.classes: folder 'Malignant' in {root} is not a declared class; "
                                  "declare it or move it out (1 undeclared)"]
    (root / "Malignant").rmdir()
    (root / "notes.txt").write_text("")
    check, refusal = both(["normal", "benign"])
    assert check == [refusal] == [f"data.source.path: {root} holds files outside class folders (first: 'notes.txt'); "
                                  "put every image in its class's folder"]
    (root / "notes.txt").unlink()
    check, refusal = both(["other", "more"])
    assert check == [refusal] == [f"data.source.classes: folder 'benign' in {root} is not a declared class; "
                                  "declare it or move it out (2 undeclared)"]


def test_a_public_sources_problems_name_the_public_source(tmp_path):
    spec = specs.spec_from_dict({**TINY, "data": {
        "declared_private_rows": 1000,
        "source": {"kind": "file", "path": str(tmp_path / "private.csv"), **FILE},
        "split": {"kind": "source", "public_source": {"kind": "file", "path": str(tmp_path / "public.csv"), **FILE}}}})
    ROWS.to_csv(tmp_path / "private.csv", index=False)
    assert source_problems(spec.data.source) == []
    assert source_problems(spec.data.split.public_source, "data.split.public_source") == [
        f"data.split.public_source.path: {tmp_path / 'public.csv'} is not a file (nothing is there)"]
    assert source_problems(specs.spec_from_dict(TINY).data.source) == []  # a packaged dataset: nothing to check


def test_the_check_imports_neither_torch_nor_the_data_package():
    """privzo validate imports it: the components.data package imports torch (seconds), pandas and numpy."""
    tree = ast.parse((Path(__file__).resolve().parents[2] / "components" / "data_check.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "csv", "json", "os", "re", "stat", "importlib.util", "pathlib", "typing",
                        "pyarrow.parquet", "components.periods"}, imported
    periods = ast.parse((Path(__file__).resolve().parents[2] / "components" / "periods.py").read_text())
    assert {alias.name for node in ast.walk(periods) if isinstance(node, ast.Import) for alias in node.names} | \
        {node.module for node in ast.walk(periods) if isinstance(node, ast.ImportFrom)} <= \
        {"__future__", "datetime", "os", "pathlib", "typing"}


def test_every_named_dataset_and_model_says_which_package_ships_it():
    """The loaders' closed registries and the table validate checks name the same things: a name added to a
    registry without its package would be loaded unchecked (validate would say ok without it)."""
    from components.data.packaged import PACKAGED
    from components.data.text import CORPORA
    from components.data_check import SHIPPED, package_missing
    from components.pretrained import PRETRAINED

    assert set(PACKAGED) | set(CORPORA) | set(PRETRAINED) | {"hf", "lora"} == set(SHIPPED)
    installed = [name for name in SHIPPED if package_missing(name, "field") is None]
    assert installed == list(SHIPPED)  # the test extras install every one of them
