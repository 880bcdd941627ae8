"""Tabular sources that work offline, each row with a content fingerprint."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import List

import numpy as np


@dataclass(frozen=True)
class Table:
    """Features (float32 values, or int64 token ids and attention masks [n, 2, length] for text), integer
    labels and one SHA-256 per row over its features and label."""

    name: str
    features: np.ndarray
    labels: np.ndarray
    n_classes: int
    fixed_scale: float | None  # a data-independent feature scale known for the source (digits: 1/16)

    def __post_init__(self) -> None:
        if len(self.features) != len(self.labels):
            raise ValueError(f"{self.name}: {len(self.features)} feature rows but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.labels)

    def row_fingerprints(self) -> List[str]:
        return [
            hashlib.sha256(self.features[i].tobytes() + int(self.labels[i]).to_bytes(8, "little")).hexdigest()
            for i in range(len(self))
        ]


def content_fingerprint(row_fingerprints: List[str]) -> str:
    """Order-independent fingerprint of a set of rows."""
    digest = hashlib.sha256()
    for fp in sorted(row_fingerprints):
        digest.update(bytes.fromhex(fp))
    return digest.hexdigest()


def load_sklearn(name: str) -> Table:
    """One of scikit-learn's bundled datasets (digits, breast_cancer, wine); exact duplicate rows dropped.

    Duplicates are dropped because the public/private/test split must be disjoint on content, not just
    on row index.
    """
    from sklearn import datasets

    loaders = {"digits": datasets.load_digits, "breast_cancer": datasets.load_breast_cancer, "wine": datasets.load_wine}
    if name not in loaders:
        raise ValueError(f"data.source.name: unknown sklearn dataset {name!r}; allowed: {', '.join(loaders)}")
    x, y = loaders[name](return_X_y=True)
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.asarray(y, dtype=np.int64)
    table = Table(name, x, y, int(y.max()) + 1, 1.0 / 16.0 if name == "digits" else None)
    fps = table.row_fingerprints()
    _, first = np.unique(np.asarray(fps), return_index=True)
    if len(first) != len(table):
        keep = np.sort(first)
        table = Table(name, x[keep], y[keep], table.n_classes, table.fixed_scale)
    return table
