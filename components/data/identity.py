"""A row's identity columns (its person, its declared row id, its arrival) as the file stores them, never as a
reader's guess: a key must not depend on the other rows of the file. A CSV's cell is its text (``0065`` stays
``0065`` whether or not another row holds ``A-7``); a typed column (Parquet, JSON Lines, a ``save_to_disk``
folder) gives its text and integers as their own text, and its dates and times in ISO 8601. Floating-point
identifiers are refused: ``65.0`` and ``65`` would be two keys for one person, and a float has lost the
leading zeros an id may have had."""
from __future__ import annotations

import datetime as dt
import numbers

import numpy as np


def integral_text(value: str):
    """A label written as a whole number in another form ('1.0') as its digits ('1'), else None: a float
    column's class 1 is the class named 1."""
    try:
        number = float(value)
    except ValueError:
        return None
    return str(int(number)) if number.is_integer() else None


def identity_text(values, field: str, file: str, need: str) -> np.ndarray:
    """``values`` (a pandas Series named by its column) as one string per row, exactly as stored; one line
    naming the column and the first value refused (missing, empty, a float, a boolean or not a scalar)."""
    import pandas as pd

    column = values.name
    missing = values.isna().to_numpy()
    if missing.any():
        raise ValueError(f"{field}: column {column!r} has missing or empty values (row {int(np.flatnonzero(missing)[0]) + 1}"
                         f" of {file}); {need}")
    if pd.api.types.is_bool_dtype(values) or pd.api.types.is_float_dtype(values):
        _refuse_value(field, column, file, values.iloc[0], 0)
    if pd.api.types.is_integer_dtype(values):
        return np.asarray([str(int(v)) for v in values], dtype=object)
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        if isinstance(value, str):
            text = value
        elif isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral, dt.date, np.datetime64)):
            _refuse_value(field, column, file, value, i)
        elif isinstance(value, numbers.Integral):
            text = str(int(value))
        else:
            text = pd.Timestamp(value).isoformat()
        if not text.strip():
            raise ValueError(f"{field}: column {column!r} has missing or empty values (row {i + 1} of {file}); {need}")
        out[i] = text
    return out


def _refuse_value(field: str, column, file: str, value, row: int) -> None:
    kind = ("true/false" if isinstance(value, (bool, np.bool_)) else
            "floating-point numbers" if isinstance(value, (float, np.floating)) else type(value).__name__)
    raise ValueError(f"{field}: column {column!r} of {file} holds {kind} ({value}, row {row + 1}), which do not keep "
                     "an identifier as written (0065 would read 65.0); store it as text or integers")


def inferred_forms(text: str) -> set:
    """Every text an earlier privzo could have keyed the id written ``text`` by, when it read identity columns
    with pandas' type inference: as written (a text column), as an integer (``0065`` -> ``65``, when every id
    of the file was a number) or as a float (``65.0``, when one of them was a decimal)."""
    forms = {text}
    try:
        number = float(text)
    except ValueError:
        return forms
    if number == number and abs(number) != float("inf"):
        forms.add(str(number))
        if number.is_integer() and text.strip().lstrip("+-").isdigit():
            forms.add(str(int(text)))
    return forms
