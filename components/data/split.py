"""Public / private / test splits with content-fingerprint disjointness (docs/design.md, "Privacy invariants" 4).

Two ways to assign rows: ``fraction_split`` permutes all rows with the public seed (exact part sizes,
but adding one row can move every other row), and ``hashed_split`` decides each row from its own content
and the seed alone, so rows never change part when others are added or removed: the split for data that
grows between scheduled runs.

Bad data is refused in one line naming the field and column, before anything is reserved or logged,
never with a row's values or a count of rows (both are functions of the private rows): NaN or inf
features (a file source names its column; any source is checked again after scaling, which can
overflow), labels outside the declared classes, and an empty private split. A private split smaller than
``sampling.expected_batch_size`` is not an error: under Poisson sampling each row joins with the public
rate expected_batch_size / data.declared_private_rows, so a small split just gives small (possibly empty)
batches, and checking it against the private count would read that count. ``fixed_size`` (replace-one,
where the count is public) refuses a batch larger than the private rows.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from components.data.table import Table, content_fingerprint
from components.randomness import STREAM_SPLIT, public_seed
from components.registry import SPLITS


class SplitOverlapError(ValueError):
    """Two splits share a row's content: refusing to train (the test or public data would leak)."""


@dataclass(frozen=True)
class Preprocessing:
    """How a row as the source stores it becomes the model's input, for the served model
    (flows/record/served.py): its named columns read as float64 and cast to float32 (as the sources read
    them), then ``kind`` none, fixed (times ``scale``, a declared constant) or public (minus ``mean``, divided
    by ``std``: the public rows' statistics, zero deviations taken as 1). Nothing in it is a function of a
    private row; ``classes`` names the labels the model answers in."""
    kind: str
    columns: Tuple[str, ...]
    classes: Tuple[str, ...]
    types: Tuple[str, ...] = ()  # each column's stored type (long or double): the served signature's
    scale: Optional[float] = None
    # kind text: the one text column, read by ``tokenizer`` (a packaged model's name or a folder) into
    # ``max_length`` ids and a mask, as components/data/text.py's encode reads it
    tokenizer: Optional[str] = None
    max_length: Optional[int] = None
    mean: Optional[Tuple[float, ...]] = None
    std: Optional[Tuple[float, ...]] = None

    def apply(self, features: np.ndarray) -> np.ndarray:
        """The split's own arithmetic on float32 rows (served.py repeats it without privzo, to the bit)."""
        if self.kind == "fixed":
            return features * np.float32(self.scale)
        if self.kind == "public":
            return ((features - np.asarray(self.mean, dtype=np.float32))
                    / np.asarray(self.std, dtype=np.float32)).astype(np.float32)
        return features


@dataclass(frozen=True)
class Part:
    features: np.ndarray
    labels: np.ndarray
    fingerprints: List[str]
    # a person-level run: each row's person as an integer (the same numbering in every part)
    persons: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def fingerprint(self) -> str:
        return content_fingerprint(self.fingerprints)

    def _update(self, digest) -> None:
        for fp in self.fingerprints:
            digest.update(bytes.fromhex(fp))


class WindowRows:
    """A run's window as a worker reads it without the ledger: the ``within`` bounds the driver handed its source
    and the positions (in the source's order) of the rows the driver chose from the ledger's records; a worker
    reading other rows there fails the ordered digest before any private step."""

    def __init__(self, within, positions: np.ndarray):
        self.within, self.positions = within, np.asarray(positions, dtype=np.int64)

    def select(self, table) -> np.ndarray:
        return self.positions


@dataclass(frozen=True)
class SplitData:
    public: Part
    private: Part
    test: Part
    n_classes: int
    n_features: int
    layout: str = ""  # what the rows' fingerprints are computed from (Table.layout)
    # with data.blocks: how the window's rows were read, for a Ray worker to read exactly them again: the bounds
    # handed to the source and the positions of the window's rows among the rows read (WindowRows)
    window_rows: Optional["WindowRows"] = None
    # how a stored row becomes a model input (float features only): what the registered model applies itself
    preprocessing: Optional[Preprocessing] = None

    @property
    def fingerprints(self) -> Dict[str, str]:
        return {"public": self.public.fingerprint, "private": self.private.fingerprint, "test": self.test.fingerprint}

    @property
    def ordered_digest(self) -> str:
        """SHA-256 of the private rows' fingerprints in order, then the public rows': two loads agree on it
        only if every index names the same private row and the features are scaled from the same public
        rows (what a Ray worker, which loads the rows itself and is sent indices, must check)."""
        digest = hashlib.sha256()
        self.private._update(digest)
        digest.update(b"public")
        self.public._update(digest)
        return digest.hexdigest()


def class_ratios(imbalance: Optional[Sequence[float]], n_classes: int) -> np.ndarray:
    """Per-class ratios: None -> all 1; two values -> linear from first to last; else one per class."""
    if imbalance is None:
        return np.ones(n_classes)
    if len(imbalance) == 2:
        return np.linspace(imbalance[0], imbalance[1], n_classes)
    if len(imbalance) != n_classes:
        raise ValueError(
            f"data.split.imbalance: {len(imbalance)} values for {n_classes} classes; give 2 values or {n_classes}"
        )
    return np.asarray(imbalance, dtype=float)


def fraction_split(
    table: Table, *, public: float, test: float, imbalance: Optional[Sequence[float]], seed: int, scale: str
) -> SplitData:
    """Seeded split: ``test`` of all rows, then ``public`` of the remaining rows (per-class ``imbalance``
    ratios), the rest private. Features are scaled without looking at private rows."""
    rng = np.random.default_rng(public_seed(seed, STREAM_SPLIT))
    n = len(table)
    order = rng.permutation(n)
    n_test = int(round(test * n))
    test_idx, train_idx = order[:n_test], order[n_test:]

    public_idx: List[int] = []
    if public > 0:
        ratios = class_ratios(imbalance, table.n_classes)
        labels = table.labels[train_idx]
        for c in range(table.n_classes):
            members = train_idx[labels == c]
            take = int(round(public * ratios[c] * len(members)))
            public_idx.extend(members[:take].tolist())  # train_idx is already a random order
    public_set = set(public_idx)
    private_idx = np.array([i for i in train_idx if i not in public_set], dtype=np.int64)
    public_arr = np.array(sorted(public_idx), dtype=np.int64)
    return _assemble(table, public_arr, private_idx, np.sort(test_idx), scale, table.row_fingerprints())


def hashed_split(
    table: Table, *, public: float, test: float, imbalance: Optional[Sequence[float]], seed: int, scale: str
) -> SplitData:
    """Per-row split: a row is test with probability ``test``, else public with probability ``public`` times
    its class's ``imbalance`` ratio, else private, decided by two uniforms hashed from (seed, row content).

    A row's part depends on nothing but its own content and the seed, so appended, removed or reordered
    rows never move the others (a row private in one run stays private in the next, which the ledger
    requires), and the public rows do not depend on how many private rows each class has. Part sizes
    are binomial around the fractions instead of exact. Rows keep their order within each part.
    """
    fps = table.row_fingerprints()
    # a person's rows are decided together, from the person alone: one person's rows in two parts would put
    # some of their data in the public or test split, used without noise
    u_test, u_public = _row_uniforms(fps if table.persons is None else person_keys(table.persons), seed)
    is_test = u_test < test
    ratios = class_ratios(imbalance, table.n_classes) if public > 0 else np.zeros(table.n_classes)
    is_public = ~is_test & (u_public < public * ratios[table.labels])
    is_private = ~is_test & ~is_public
    return _assemble(table, np.flatnonzero(is_public), np.flatnonzero(is_private), np.flatnonzero(is_test),
                     scale, fps)


def column_split(table: Table, *, test: float, seed: int, scale: str) -> SplitData:
    """Public rows are the rows the data owner flagged (``table.public_flags``); each other row is test
    with probability ``test`` (hashed from the seed and its content, as in ``hashed_split``), else private."""
    if table.public_flags is None:
        raise ValueError("data.split.kind: column needs a file source read with its flag column")
    fps = table.row_fingerprints()
    u_test, _ = _row_uniforms(fps, seed)
    public = table.public_flags
    is_test = ~public & (u_test < test)
    return _assemble(table, np.flatnonzero(public), np.flatnonzero(~public & ~is_test), np.flatnonzero(is_test),
                     scale, fps)


def source_split(table: Table, public_table: Table, *, test: float, seed: int, scale: str,
                 drop_shared: bool = False) -> SplitData:
    """Every row of ``public_table`` is public; each row of ``table`` is test with probability ``test``
    (hashed as in ``hashed_split``), else private. ``scale`` applies to both, from the public rows.
    ``drop_shared``: a row of ``table`` whose content ``public_table`` also has is left out (otherwise the
    parts overlap and are refused); whether a row is left out depends on that row and the public rows only."""
    if public_table.n_classes != table.n_classes:
        raise ValueError(f"data.split.public_source: {public_table.n_classes} classes, the main source has "
                         f"{table.n_classes}")
    if None not in (table.class_names, public_table.class_names) and \
            [str(c) for c in public_table.class_names] != [str(c) for c in table.class_names]:
        # a label is a position among the classes: the same count in another order would relabel public rows
        raise ValueError(f"data.split.public_source: its classes are {', '.join(map(str, public_table.class_names))}, "
                         f"the main source's {', '.join(map(str, table.class_names))}; give both the same, in the "
                         "same order")
    if table.columns is not None and public_table.columns is not None:
        missing = [c for c in table.columns if c not in public_table.columns]
        extra = [c for c in public_table.columns if c not in table.columns]
        if missing or extra:
            first = f"no {missing[0]!r}" if missing else f"{extra[0]!r} is extra"
            raise ValueError(f"data.split.public_source: its feature columns are not the main source's ({first}); "
                             "both need the same named features")
        order = [public_table.columns.index(c) for c in table.columns]  # matched by name, in the model's order
        public_table = replace(public_table, features=np.ascontiguousarray(public_table.features[:, order]))
    if public_table.features.shape[1:] != table.features.shape[1:] or public_table.features.dtype != table.features.dtype:
        raise ValueError(f"data.split.public_source: rows of shape {public_table.features.shape[1:]}, the main "
                         f"source's are {table.features.shape[1:]}; both must have the same features")
    # both fingerprinted one way (the main source's), so content they share is found whatever the sources
    public_table = replace(public_table, columns=table.columns, class_names=table.class_names)
    fps = table.row_fingerprints()
    if drop_shared:
        public_fps = set(public_table.row_fingerprints())
        kept = np.asarray([i for i, fp in enumerate(fps) if fp not in public_fps], dtype=np.int64)
        table = table.take(kept)
        fps = [fps[i] for i in kept]
    u_test, _ = _row_uniforms(fps, seed)
    n = len(table)
    same_scale = public_table.fixed_scale == table.fixed_scale
    both = Table(table.name, np.concatenate([table.features, public_table.features]),
                 np.concatenate([table.labels, public_table.labels]), table.n_classes,
                 table.fixed_scale if same_scale else None, columns=table.columns, layout=table.layout,
                 class_names=table.class_names, feature_names=table.feature_names, label_names=table.label_names,
                 column_types=table.column_types, text_input=table.text_input)
    is_test = u_test < test
    return _assemble(both, np.arange(n, n + len(public_table)), np.flatnonzero(~is_test), np.flatnonzero(is_test),
                     scale, fps + public_table.row_fingerprints())


def person_keys(persons) -> List[str]:
    """A SHA-256 per row of its person's id: what a person-level split hashes instead of the row's content."""
    return [hashlib.sha256(b"person:" + str(p).encode("utf-8")).hexdigest() for p in persons]


def _row_uniforms(fps: List[str], seed: int):
    """Two uniforms in [0, 1) per row, from a hash of the public seed and the row's content alone."""
    n = len(fps)
    first, second = np.empty(n), np.empty(n)
    salt = public_seed(seed, STREAM_SPLIT).to_bytes(8, "little")
    for i, fp in enumerate(fps):
        word = hashlib.blake2b(salt + bytes.fromhex(fp), digest_size=16).digest()
        # 53-bit uniforms, which float64 holds exactly
        first[i] = (int.from_bytes(word[:8], "little") >> 11) * 2.0**-53
        second[i] = (int.from_bytes(word[8:], "little") >> 11) * 2.0**-53
    return first, second


def _assemble(table: Table, public_idx: np.ndarray, private_idx: np.ndarray, test_idx: np.ndarray, scale: str,
              fps: List[str]) -> SplitData:
    if len(private_idx) == 0:
        raise ValueError("data.split: no private rows left: every row went to the public or test split")
    labels = table.labels
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= table.n_classes):
        raise ValueError(f"data.source.label: {table.name} has labels outside its {table.n_classes} classes "
                         f"(0..{table.n_classes - 1}); list every class")
    _check_finite(table, table.features, "data.source.features", "has missing or non-finite values (NaN or inf); "
                  "fill or drop them first")
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused just below, in one line
        features, preprocessing = _scaled(table, public_idx, scale)
    if features is not table.features:
        _check_finite(table, features, "data.source.scale", f"is not finite after scaling ({scale}): its values "
                      "overflow float32 once scaled; rescale the column or use scale: none")

    codes = None if table.persons is None else np.unique(np.asarray(table.persons, dtype=str), return_inverse=True)[1]

    def part(idx: np.ndarray) -> Part:
        return Part(features[idx], table.labels[idx], [fps[i] for i in idx], None if codes is None else codes[idx])

    data = SplitData(part(public_idx), part(private_idx), part(test_idx), table.n_classes, features.shape[1],
                     table.layout, preprocessing=preprocessing)
    check_disjoint(data)
    return data


def _check_finite(table: Table, features: np.ndarray, field: str, problem: str) -> None:
    """Refuse NaN or inf features, naming the first such column only (no row, value or count). Token ids
    (integer features) cannot be non-finite."""
    if not np.issubdtype(features.dtype, np.floating):
        return
    flat = features.reshape(len(features), -1)
    # a float64 sum is NaN or inf exactly when a value is (float32 values cannot overflow it): one pass and
    # no copy of a large image table; the per-column pass runs only to name the column
    if np.isfinite(flat.sum(dtype=np.float64)):
        return
    bad = ~np.isfinite(flat).all(axis=0)
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        name = repr(table.columns[j]) if table.columns is not None and flat.shape[1] == len(table.columns) \
            else f"{j} (0-based, in the model's input order)"
        raise ValueError(f"{field}: column {name} of {table.name} {problem}")


def _scaled(table: Table, public_idx: np.ndarray, scale: str):
    """The features scaled as ``scale`` says, and the Preprocessing that repeats it on a stored row (None for
    token ids and images, whose served input is not a row of named numbers)."""
    if scale == "auto":
        scale = "fixed" if table.fixed_scale is not None else "public"
    if scale == "none":
        prep = Preprocessing("none", (), ())
    elif scale == "fixed":
        if table.fixed_scale is None:
            raise ValueError(f"data.source.scale: no fixed scale is known for {table.name}; use public or none")
        prep = Preprocessing("fixed", (), (), scale=float(np.float32(table.fixed_scale)))
    elif scale == "public":
        if len(public_idx) < 2:
            raise ValueError("data.source.scale: public standardisation needs at least 2 public rows")
        pub = table.features[public_idx]
        mean, std = pub.mean(axis=0), pub.std(axis=0)
        std = np.where(std > 0, std, np.float32(1.0)).astype(np.float32)
        prep = Preprocessing("public", (), (), mean=tuple(map(float, mean.reshape(-1))),
                             std=tuple(map(float, std.reshape(-1))))
    else:
        raise ValueError(f"data.source.scale: unknown {scale!r}; allowed: auto, none, fixed, public")
    if prep.kind == "public":
        features = ((table.features - mean) / std).astype(np.float32)
    else:
        features = prep.apply(table.features)
    tabular = table.features.ndim == 2 and np.issubdtype(table.features.dtype, np.floating)
    served = replace(prep, columns=table.served_columns, types=table.served_types, classes=table.served_classes) \
        if tabular else None
    if table.text_input is not None and prep.kind == "none":
        column, tokenizer, max_length = table.text_input
        served = Preprocessing("text", (str(column),), table.served_classes, ("string",), tokenizer=str(tokenizer),
                               max_length=int(max_length))
    return features, served


def check_disjoint(data: SplitData) -> None:
    parts = {"public": data.public, "private": data.private, "test": data.test}
    names = list(parts)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            shared = set(parts[a].fingerprints) & set(parts[b].fingerprints)
            if shared:
                # no count: how many public rows are also private is a function of the private rows
                raise SplitOverlapError(f"data.split: some rows appear in both {a} and {b}; the splits must be "
                                        "disjoint (a public source must not contain the main source's rows)")


@SPLITS.register("fraction", "hashed")
def _fractions(spec, table, scale, load_public=None):
    split = spec.data.split
    assign = hashed_split if split.kind == "hashed" else fraction_split
    return assign(table, public=split.public, test=split.test, imbalance=split.imbalance, seed=spec.seed,
                  scale=scale)


@SPLITS.register("column")
def _column(spec, table, scale, load_public=None):
    return column_split(table, test=spec.data.split.test, seed=spec.seed, scale=scale)


@SPLITS.register("source")
def _source(spec, table, scale, load_public):
    """``load_public(source)``: the public source's rows, read as the main source's are."""
    split = spec.data.split
    try:
        public_table, _ = load_public(split.public_source)
    except ValueError as err:  # the loaders name data.source; here it is the public source
        raise ValueError(str(err).replace("data.source.", "data.split.public_source.", 1)) from None
    return source_split(table, public_table, test=split.test, seed=spec.seed, scale=scale,
                        drop_shared=split.shared_rows == "drop_private")
