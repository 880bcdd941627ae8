"""Tabular sources, each row with a content fingerprint: datasets bundled offline, and the user's own
CSV, Parquet or JSON Lines files."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from components.data_check import (HF_DATASETS_MISSING, HF_INDEX, NOT_SAVED_TO_DISK, csv_header, file_kind,
                                   first_line, hf_split_of, missing_column, name_problems)


from components.data.table import Table, unique_rows, content_fingerprint, identity_layout  # noqa: F401
from components.data.identity import identity_text, integral_text
from components.periods import partition_files
from components.registry import SOURCES


def load_sklearn(name: str) -> Table:
    """One of scikit-learn's bundled datasets (digits, breast_cancer, wine); exact duplicate rows dropped.

    Duplicates are dropped because the public/private/test split must be disjoint on content, not just
    on row index.
    """
    from sklearn import datasets

    loaders = {"digits": datasets.load_digits, "breast_cancer": datasets.load_breast_cancer, "wine": datasets.load_wine}
    if name not in loaders:
        raise ValueError(f"data.source.name: unknown sklearn dataset {name!r}; allowed: {', '.join(loaders)}")
    bundle = loaders[name]()
    x = np.ascontiguousarray(bundle.data, dtype=np.float32)
    y = np.asarray(bundle.target, dtype=np.int64)
    return unique_rows(Table(name, x, y, int(y.max()) + 1, 1.0 / 16.0 if name == "digits" else None,
                              layout=f"sklearn:{name}", feature_names=tuple(map(str, bundle.feature_names)),
                              label_names=tuple(map(str, bundle.target_names))))


def load_file(path: Union[str, Path], *, file_format: str, label: str, classes: Sequence[Union[int, str]],
              features: Optional[Sequence[str]] = None, text: Optional[str] = None,
              tokenizer: Optional[str] = None, max_length: int = 32, public_flag: Optional[str] = None,
              hf_split: Optional[str] = None, arrival: Optional[str] = None, person: Optional[str] = None,
              partitions: Optional[str] = None, prompt=None, row_id: Optional[str] = None) -> Table:
    """Rows of a CSV, Parquet or JSON Lines file, or of a Hugging Face ``save_to_disk`` folder (``hf_split``
    of a DatasetDict; a ClassLabel label column is read by its codes): the numeric ``features`` columns (default: every column but ``label``)
    as float32, or with ``text`` that column as ``tokenizer``'s ids and attention mask (int64 [n, 2,
    max_length], as the text sources give); ``label`` mapped to its position in ``classes``; with
    ``public_flag`` that column's true/false as ``public_flags`` (and never a feature); with ``arrival``
    and ``person`` (data.blocks) those columns as written, as ``arrivals`` and ``persons`` (never features);
    with ``partitions`` (a period: day, week or month), ``path`` is a folder of files named by period, and a
    row's arrival is the first day of its file's period; with ``prompt`` (a language model's), each text is
    filled into its template (int64 [n, 3, max_length], components/data/prompts.py); with ``row_id`` that
    column's values (unique) as ``row_ids``, each row's identity; without it exact duplicate rows dropped.

    ``classes`` comes from the spec, never from the file: the model's output size is released, and a
    label set read from the data would tell whether a rare class occurs among the private rows.
    """
    import pandas as pd

    path = Path(path)
    arrived = None
    identity = tuple(c for c in (arrival, person, row_id) if c is not None)
    if partitions is not None:  # one file per period: a row's arrival is its file's period
        frames = []
        for part, start in partition_files(path, partitions):
            kind = file_kind(part, file_format)
            if kind == "hf_disk":
                raise ValueError(f"data.source.path: {part.name} in {path} is a folder; a partitioned source "
                                 "holds csv, parquet or jsonl files, one per period")
            frames.append((part, start, read_frame(part, kind, label, text, classes, public_flag, hf_split,
                                                    identity)))
        first = frames[0]
        for part, _, frame in frames[1:]:
            if list(frame.columns) != list(first[2].columns):
                raise ValueError(f"data.source.path: {part.name} has columns {list(frame.columns)}, {first[0].name} "
                                 f"has {list(first[2].columns)}; every file of {path.name} needs the same columns")
        kept = [(start, f) for _, start, f in frames if len(f)]  # a period with no rows adds none
        frame = pd.concat([f for _, f in kept], ignore_index=True) if kept else first[2]
        arrived = np.concatenate([np.full(len(f), start, dtype=object) for start, f in kept]) if kept else None
    else:
        frame = read_frame(path, file_kind(path, file_format, hf_split), label, text, classes, public_flag, hf_split,
                            identity)
    columns = list(frame.columns)
    if len(frame) == 0:
        raise ValueError(f"data.source.path: {path} has no rows")

    def require(field: str, name: str) -> None:
        refuse_problems([missing_column(field, name, columns, path.name)])

    require("data.source.label", label)
    labels = _class_positions(frame, label, classes)
    if public_flag is not None:
        require("data.split.column", public_flag)
    flags = _flags(frame, public_flag) if public_flag is not None else None
    meta = {} if arrived is None else {"arrivals": arrived}
    for field, column in (("arrival", arrival), ("person", person)):
        if column is not None:
            require(f"data.blocks.{field}", column)
            meta[f"{field}s"] = identity_text(frame[column], f"data.blocks.{field}", path.name,
                                              f"every row needs its {field}")
    if row_id is not None:
        meta["row_ids"] = _row_ids(frame, row_id, columns, path.name)
    if text is not None:
        require("data.source.text", text)
        lines = frame[text]
        if lines.isna().any() or (lines.astype(str).str.strip() == "").any():
            raise ValueError(f"data.source.text: column {text!r} has missing or empty values; fill or drop them first")
        from components import pretrained
        from components.data.prompts import encode_prompted
        from components.data.text import encode

        if not lines.map(lambda v: isinstance(v, str)).all():
            raise ValueError(f"data.source.text: column {text!r} holds values that are not text (numbers, lists or "
                             "objects); give every row a string")
        if prompt is None:
            ids = encode(list(lines), pretrained.tokenizer(tokenizer), max_length)
        else:
            ids = encode_prompted(list(lines), pretrained.tokenizer(tokenizer), max_length, prompt)
        layout = f"file:label={label};text={text};tokenizer={tokenizer};max_length={max_length};classes=by-name"
        if prompt is not None:
            layout += f";{prompt.layout}"
        if row_id is not None:  # a row's fingerprint is then its identifier alone
            layout = f"file:row_id={row_id}"
        layout = identity_layout(layout, person is not None, row_id is not None)
        return unique_rows(Table(path.name, ids, labels, len(classes), None, flags, layout=layout,
                                  class_names=tuple(str(c) for c in classes),
                                  text_input=None if prompt is not None else (text, tokenizer, max_length), **meta))
    names = list(features) if features is not None else [c for c in columns
                                                         if c not in (label, public_flag, arrival, person, row_id)]
    for name in names:
        require("data.source.features", name)
    if label in names:
        raise ValueError(f"data.source.features: the label column {label!r} cannot also be a feature")
    if not names:
        raise ValueError(f"data.source.features: {path.name} has no column besides the label {label!r}")
    for column in names:
        if not pd.api.types.is_numeric_dtype(frame[column]) or pd.api.types.is_bool_dtype(frame[column]):
            raise ValueError(f"data.source.features: column {column!r} is not numeric; encode it as numbers first "
                             "or leave it out of features")
    with np.errstate(over="ignore"):  # checked after the cast, where 1e39 has become inf
        values = frame[names].to_numpy(dtype=np.float64).astype(np.float32)
    bad = ~np.isfinite(values).all(axis=0)
    if bad.any():
        raise ValueError(f"data.source.features: column {names[int(np.flatnonzero(bad)[0])]!r} has missing or "
                         "non-finite values, or values beyond float32's range (3.4e38); fill, drop or rescale them")
    layout = f"file:label={label};features={','.join(sorted(names))};classes=by-name" if row_id is None \
        else f"file:row_id={row_id}"
    layout = identity_layout(layout, person is not None, row_id is not None)
    kinds = tuple("long" if pd.api.types.is_integer_dtype(frame[c]) else "double" for c in names)
    return unique_rows(Table(path.name, np.ascontiguousarray(values), labels, len(classes), None, flags,
                              columns=tuple(names), layout=layout, class_names=tuple(str(c) for c in classes),
                              column_types=kinds, **meta))


def read_frame(path: Path, kind: str, label: str, text: Optional[str], classes, public_flag: Optional[str],
                hf_split: Optional[str], identity: Sequence[str] = ()):
    """One file's rows as a frame with its column names as text, their names checked; one line where it
    cannot be read. ``identity``: the columns that name a row, its person or its arrival, which a CSV gives
    as written (never as numbers or dates pandas guessed from the other rows)."""
    import pandas as pd

    try:
        if kind == "hf_disk":
            frame = _read_hf_disk(path, hf_split, label, classes, public_flag)
        elif kind == "parquet":
            frame = pd.read_parquet(path)
        elif kind == "jsonl":  # one JSON object per line; strings stay strings (no date or number guessing)
            frame = pd.read_json(path, lines=True, dtype=False, convert_dates=False)
        else:
            _check_csv_header(path)
            # the label as written ('01' is not 1); text as written too: 'NA', 'None' or '1.0' are lines
            as_written = {label: str, **({text: str} if text is not None else {}), **{c: str for c in identity}}
            frame = pd.read_csv(path, dtype=as_written, keep_default_na=text is None)
    except ValueError as err:
        if str(err).startswith("data.source"):
            raise
        raise ValueError(f"data.source.path: cannot read {path} as {kind}: {first_line(err)}") from None
    except Exception as err:  # noqa: BLE001 - the readers raise many types; the user needs the one line
        raise ValueError(f"data.source.path: cannot read {path} as {kind}: {first_line(err)}") from None
    frame.columns = [str(c) for c in frame.columns]
    if kind != "csv":  # a CSV's header was checked as written, before pandas renamed its unnamed and repeated cells
        refuse_problems(name_problems(list(frame.columns), path.name))
    return frame


def _read_hf_disk(path: Path, split: Optional[str], label: str, classes: Sequence[Union[int, str]],
                  public_flag: Optional[str]):
    """A ``save_to_disk`` folder (Dataset, or one split of a DatasetDict) as a frame, read by Hugging Face
    datasets itself, with the values its own ``to_parquet`` export holds, so that a row has the same
    identity (and ledger record) in the folder and in that export: a ClassLabel label is its integer code
    (-1, datasets' mark of an unlabelled row, is a missing label). A ClassLabel used as the public flag is
    read by its names (yes/no, true/false), since its codes say nothing about which rows are public. The
    pandas index that ``Dataset.from_pandas`` stores as a column is dropped, as pandas drops it from Parquet."""
    try:
        import datasets
    except ImportError:
        raise ValueError(HF_DATASETS_MISSING) from None
    try:
        loaded = datasets.load_from_disk(str(path))
    except FileNotFoundError:
        raise ValueError(f"data.source.path: {path} {NOT_SAVED_TO_DISK}") from None
    if isinstance(loaded, datasets.DatasetDict):
        loaded = loaded[hf_split_of(path, list(loaded), split)]
    elif split is not None:
        raise ValueError(f"data.source.hf_split: {path.name} holds one Dataset, not a DatasetDict; remove hf_split")
    frame = loaded.to_pandas()
    frame = frame.drop(columns=[c for c in frame.columns if HF_INDEX.fullmatch(str(c))])
    feature = loaded.features.get(label)
    if isinstance(feature, datasets.ClassLabel):
        declared = {str(c) for c in classes}
        if declared & set(feature.names) and not declared & {str(i) for i in range(feature.num_classes)}:
            raise ValueError(f"data.source.classes: column {label!r} is a ClassLabel, read by its codes 0.."
                             f"{feature.num_classes - 1} (as datasets' own Parquet export holds it); declare "
                             "classes as those codes, in the order of the names")
        frame[label] = frame[label].where(frame[label] >= 0)  # -1: unlabelled
    flag = loaded.features.get(public_flag) if public_flag is not None else None
    if isinstance(flag, datasets.ClassLabel):
        frame[public_flag] = frame[public_flag].map(
            lambda code: flag.names[int(code)] if code == code and 0 <= code < flag.num_classes else None)
    return frame


def _check_csv_header(path: Path) -> None:
    """pandas names an empty header cell 'Unnamed: N' and renames a repeated one ('y', 'y.1'), and would take
    either as a feature: refuse both, on the header as written."""
    refuse_problems(name_problems(csv_header(path), path.name))


def refuse_problems(problems) -> None:
    problems = [p for p in problems if p]
    if problems:
        raise ValueError("; ".join(problems))


_TRUE, _FALSE = {"true", "yes", "1"}, {"false", "no", "0"}


def _flags(frame, column: str) -> np.ndarray:
    """A flag column as booleans: true/false, yes/no or 1/0 (any case); anything else is refused rather
    than guessed, since a wrong guess makes someone's row public."""
    words = frame[column].astype(str).str.strip().str.lower().replace({"1.0": "1", "0.0": "0"})
    if frame[column].isna().any() or not words.isin(_TRUE | _FALSE).all():
        raise ValueError(f"data.split.column: column {column!r} must hold true/false, yes/no or 1/0 in every row")
    return words.isin(_TRUE).to_numpy()


def _class_positions(frame, label: str, classes: Sequence[Union[int, str]]) -> np.ndarray:
    import pandas as pd

    position = {str(c): i for i, c in enumerate(classes)}
    raw = frame[label]
    if raw.isna().any():
        raise ValueError(f"data.source.label: column {label!r} has missing values")
    if pd.api.types.is_float_dtype(raw) and (raw == raw.round()).all():
        raw = raw.astype(np.int64)  # 1.0 in a float column (Parquet, JSON) is the class 1
    labels = raw.astype(str).map(position)
    if labels.isna().any():
        # a label written '1.0' in a file whose classes are numbers is the class 1
        labels = labels.fillna(raw.astype(str).map(lambda v: position.get(integral_text(v))))
    if labels.isna().any():
        raise ValueError(f"data.source.classes: column {label!r} has labels not among classes "
                         f"{[str(c) for c in classes]}; list every class")
    return labels.to_numpy(dtype=np.int64)


def _row_ids(frame, column: str, columns, file: str) -> np.ndarray:
    """The declared identifiers as written: every row has one, and no two rows share one."""
    refuse_problems([missing_column("data.source.row_id", column, columns, file)])
    ids = identity_text(frame[column], "data.source.row_id", file, "every row needs its identifier")
    repeated = len(ids) - len(set(ids))
    if repeated:
        raise ValueError(f"data.source.row_id: column {column!r} repeats identifiers ({repeated} rows share one with "
                         "an earlier row); each row needs its own, or leave row_id out")
    return ids


@SOURCES.register("sklearn")
def _sklearn(source, model_tokenizer=None, public_flag=None):
    return load_sklearn(source.name), source.scale


@SOURCES.register("file")
def _file(source, model_tokenizer=None, public_flag=None, blocks=None, prompt=None):
    """A file's text column is tokenised by the model's own tokenizer unless the source names one (through a
    language model's ``prompt``, if any); with ``blocks`` (data.blocks) its arrival and person columns are read
    as metadata."""
    table = load_file(source.path, file_format=source.format, label=source.label, classes=source.classes,
                      features=source.features, text=source.text, tokenizer=source.tokenizer or model_tokenizer,
                      max_length=source.max_length, public_flag=public_flag, hf_split=source.hf_split,
                      arrival=blocks.arrival if blocks else None, person=blocks.person if blocks else None,
                      partitions=blocks.period if blocks and blocks.partitioned else None, prompt=prompt,
                      row_id=source.row_id)
    return table, "none" if source.text is not None else "public" if source.scale == "auto" else source.scale


@SOURCES.register("sql")
def _sql(source, model_tokenizer=None, public_flag=None, blocks=None, within=None, prompt=None):
    """A database table (components/data/sql.py); ``within``: a run's window, pushed to the database. A text
    column is tokenised as a file's is (the source's tokenizer, else the model's)."""
    from components.data.sql import load_sql

    table = load_sql(source, public_flag=public_flag, blocks=blocks, within=within,
                     tokenizer=source.tokenizer or model_tokenizer, prompt=prompt)
    return table, "none" if source.text is not None else "public" if source.scale == "auto" else source.scale
