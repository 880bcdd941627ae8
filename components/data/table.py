"""The rows every source returns, and their keyed content fingerprints (a module of its own, so that the
sources and the text loader both stand on it without importing each other)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import List

import numpy as np


# what a row layout says of its identity columns: read as written (components/data/identity.py), and, at person
# level, each row's identity holding its person
IDS_AS_WRITTEN, ROWS_PER_PERSON = "ids=as-written", "rows=per-person"


def identity_layout(layout: str, persons: bool, row_ids: bool) -> str:
    """``layout`` with the marks of how its person and row-id columns were read (none without either)."""
    if persons or row_ids:
        layout += f";{IDS_AS_WRITTEN}"
    return layout + (f";{ROWS_PER_PERSON}" if persons else "")


# what a row layout says of identity columns a database keeps as integers: read as their digits, so a
# migration of the column to text (65 recorded, '0065' written now) changes the layout, not the persons
INTEGER_IDS = "integer-ids"


def typed_identity(layout: str, integer_roles) -> str:
    """``layout`` with the identity roles (``person``, ``row_id``) a database keeps as integers."""
    return layout + (f";{INTEGER_IDS}={','.join(integer_roles)}" if integer_roles else "")


def untyped_identity_layout(layout: str) -> str:
    """The layout a privzo that kept no identity types recorded for the same source."""
    return ";".join(p for p in layout.split(";") if not p.startswith(f"{INTEGER_IDS}="))


def legacy_identity_layout(layout: str) -> str:
    """The layout an earlier privzo recorded for the same source: its identity columns read with pandas' type
    inference, and a person-level row's identity its content alone."""
    return ";".join(p for p in untyped_identity_layout(layout).split(";") if p not in (IDS_AS_WRITTEN, ROWS_PER_PERSON))


@dataclass(frozen=True)
class Table:
    """Features (float32 values, or int64 token ids and attention masks [n, 2, length] for text), integer
    labels and one SHA-256 per row over its features and label."""

    name: str
    features: np.ndarray
    labels: np.ndarray
    n_classes: int
    fixed_scale: float | None  # a data-independent feature scale known for the source (digits: 1/16)
    public_flags: np.ndarray | None = None  # rows the data owner flagged public (data.split.kind column)
    # a file's feature columns by name, in the model's order; fingerprints read them sorted by name, so a
    # re-exported file with its columns in another order keeps every row's identity
    columns: tuple | None = None
    # what a row's fingerprint is computed from (source, columns, tokenizer): the ledger refuses to match
    # rows of runs that computed it differently
    layout: str = ""
    # the declared class names (a user's file or image folder): a row's identity then holds its class's
    # name, not its position, so reordering or extending ``classes`` keeps every row (and its part of a
    # hashed split) where it was
    class_names: tuple | None = None
    # with data.blocks: each row's arrival value and person, as written (public metadata, never features)
    arrivals: np.ndarray | None = None
    persons: np.ndarray | None = None
    # data.source.row_id: each row's declared identifier, as written; a row's identity is then that alone
    row_ids: np.ndarray | None = None
    # the names a source gives its features and classes where they are no part of a row's identity (a bundled
    # dataset's): the served model's column schema and labels only (``served_columns``, ``served_classes``)
    feature_names: tuple | None = None
    label_names: tuple | None = None
    # each feature column's stored kind, "long" (an integer column) or "double": the served model's input types
    column_types: tuple | None = None
    # a text source's (column, tokenizer, max_length): how a stored text became these ids, which the served
    # model repeats (a language model's prompted rows have none: their template is not served yet)
    text_input: tuple | None = None

    @property
    def served_columns(self) -> tuple:
        """The features' names as the source stores them, in the model's order (a consumer's input columns)."""
        width = int(np.prod(self.features.shape[1:])) if self.features.ndim > 1 else 1
        return tuple(self.columns or self.feature_names or (f"feature_{j}" for j in range(width)))

    @property
    def served_types(self) -> tuple:
        """Each input column's type as MLflow's signatures name it (long or double), as the source stores it."""
        return tuple(self.column_types or ("double",) * len(self.served_columns))

    @property
    def served_classes(self) -> tuple:
        """The classes' names, by label (what a served model answers)."""
        return tuple(str(c) for c in (self.class_names or self.label_names or range(self.n_classes)))

    def take(self, index: np.ndarray) -> "Table":
        """The rows at ``index``, every per-row field with them."""
        pick = (lambda a: None if a is None else a[index])
        return replace(self, features=self.features[index], labels=self.labels[index],
                       public_flags=pick(self.public_flags), arrivals=pick(self.arrivals), persons=pick(self.persons),
                       row_ids=pick(self.row_ids))

    def __post_init__(self) -> None:
        if len(self.features) != len(self.labels):
            raise ValueError(f"{self.name}: {len(self.features)} feature rows but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.labels)

    def _canonical(self) -> np.ndarray:
        if self.columns is None:
            return self.features
        return np.ascontiguousarray(self.features[:, np.argsort(np.asarray(self.columns, dtype=object))])

    def content_keys(self) -> List[bytes]:
        """One key per row over its features alone (no label); at person level, over its person and features,
        since two persons' rows of equal content are two persons' rows."""
        canonical = self._canonical()
        if self.persons is not None:
            return [person_key(p) + canonical[i].tobytes() for i, p in enumerate(self.persons)]
        return [canonical[i].tobytes() for i in range(len(self))]

    def row_fingerprints(self) -> List[str]:
        """One SHA-256 per row: of its declared row id, else of its content and label; at person level, with
        the row's person, so that a row is never another person's (components/data/blocks.py)."""
        if self.row_ids is not None:  # declared identity: the same row re-encoded keeps its fingerprint
            own = [hashlib.sha256(b"row_id:" + str(i).encode("utf-8")).hexdigest() for i in self.row_ids]
        elif self.class_names is None:
            own = [hashlib.sha256(key + int(label).to_bytes(8, "little")).hexdigest()
                   for key, label in zip(self.content_keys(), self.labels)]
        else:
            names = [b"class:" + str(name).encode("utf-8") for name in self.class_names]
            own = [hashlib.sha256(key + names[int(label)]).hexdigest()
                   for key, label in zip(self.content_keys(), self.labels)]
        if self.persons is None or self.row_ids is None:
            return own  # content keys already hold the person
        return [hashlib.sha256(person_key(p) + bytes.fromhex(fp)).hexdigest() for p, fp in zip(self.persons, own)]


def person_key(person) -> bytes:
    """A person's id as bytes, length-prefixed so that no id and row content run into another's."""
    raw = str(person).encode("utf-8")
    return b"person:" + len(raw).to_bytes(4, "little") + raw


def content_fingerprint(row_fingerprints: List[str]) -> str:
    """Order-independent fingerprint of a set of rows."""
    digest = hashlib.sha256()
    for fp in sorted(row_fingerprints):
        digest.update(bytes.fromhex(fp))
    return digest.hexdigest()


def unique_rows(table: Table) -> Table:
    """The table with exact duplicate rows dropped (first kept, order kept), and every row whose features
    also occur under another label dropped (it has no single label, and its copies could land in two
    splits). A row is flagged public only if every copy of it is: its content is also someone's private
    row otherwise. Rows with declared identifiers (data.source.row_id, unique) are kept as they are: two
    rows of equal content are then two rows."""
    if table.row_ids is not None:
        return table
    keys = table.content_keys()
    label_sets: dict = {}
    for key, label in zip(keys, table.labels):
        label_sets.setdefault(key, set()).add(int(label))
    fps = np.asarray(table.row_fingerprints())
    _, first, inverse = np.unique(fps, return_index=True, return_inverse=True)
    keep = np.asarray([i for i in np.sort(first) if len(label_sets[keys[i]]) == 1], dtype=np.int64)
    if len(keep) == len(table):
        return table
    flags = table.public_flags
    if flags is not None:
        all_public = np.ones(len(first), dtype=bool)
        np.logical_and.at(all_public, inverse, flags)
        flags = all_public[inverse][keep]
    return replace(table.take(keep), public_flags=flags)
