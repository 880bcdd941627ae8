"""``privzo budget migrate-ids``: the ledger owner's re-keying of a dataset whose rows keep their people but
change how they are identified, once, on data holding every person and row its runs recorded (the rows are the
same people: their records and blocks carry over, and no second lifetime is made):

- ids an earlier privzo read with pandas' type inference (``0065`` keyed as ``65`` while every id of the file was
  a number, as ``0065`` once one was not), re-keyed to the ids as written (components/data/identity.py);
- an identity column a database kept as integers that is now text (``65`` recorded, ``'0065'`` written now), or
  the other way round: the recorded keys matched against the texts each id could have had;
- rows identified by their content (no ``row_id``) moving to a source with a key: each recorded content
  fingerprint re-keyed to the id of the row holding that content;
- a ledger written before identity types were recorded: the types recorded, the keys unchanged.

Each id as written has the few texts the old reading could have keyed it by (as written, as an integer, as a
float); the ledger's recorded keys are matched against all of them, so a person recorded under ``65`` and
under ``0065`` (the drift this fixes) keeps the earlier of the two blocks."""
from __future__ import annotations

import hashlib
from typing import Dict, Iterable, Set

import specs
from components.builders import source_table
from components.data.identity import inferred_forms
from components.data.split import person_keys
from components.data.table import (INTEGER_IDS, ROWS_PER_PERSON, Table, identity_layout, legacy_identity_layout,
                                   untyped_identity_layout)
from flows.record.tracking import KEYED_ROWS, keyed_rows


def _mapping(legacy: Iterable[Iterable[str]], now: Iterable[str]) -> Dict[str, Set[str]]:
    out: Dict[str, Set[str]] = {}
    for forms, key in zip(legacy, now):
        for form in forms:
            out.setdefault(form, set()).add(key)
    return out


def legacy_keys(table: Table) -> Dict[str, Dict[str, Set[str]]]:
    """{person | row: {a keyed legacy key -> the keyed keys as written of the rows that could have had it}}."""
    persons: Dict[str, Set[str]] = {}
    if table.persons is not None:
        values = [str(p) for p in table.persons]
        forms = sorted({f for v in values for f in inferred_forms(v)})
        keyed = dict(zip(forms, keyed_rows(person_keys(forms))))
        persons = _mapping(([keyed[f] for f in inferred_forms(v)] for v in values), keyed_rows(person_keys(values)))
    if table.row_ids is not None:  # a row's old fingerprint was its id alone, as pandas read it
        def fp(text: str) -> str:
            return hashlib.sha256(b"row_id:" + text.encode("utf-8")).hexdigest()
        legacy = [keyed_rows([fp(f) for f in sorted(inferred_forms(str(i)))]) for i in table.row_ids]
    else:  # a person-level row's old fingerprint was its content alone
        from dataclasses import replace

        legacy = [[k] for k in keyed_rows(replace(table, persons=None).row_fingerprints())]
    return {"person": persons, "row": _mapping(legacy, keyed_rows(table.row_fingerprints()))}


def content_layout(table: Table, label: str) -> str:
    """The layout the same rows had when a file without ``row_id`` identified them by content (its label column
    ``label``)."""
    persons = ROWS_PER_PERSON in table.layout.split(";")
    if not table.layout.startswith("file:") or table.columns is None or table.class_names is None:
        return ""
    return identity_layout(f"file:label={label};features={','.join(sorted(table.columns))};classes=by-name",
                           persons, False)


def _unchanged(table: Table) -> Dict[str, Dict[str, Set[str]]]:
    persons = {} if table.persons is None else {k: {k} for k in keyed_rows(person_keys([str(p) for p in table.persons]))}
    return {"person": persons, "row": {k: {k} for k in keyed_rows(table.row_fingerprints())}}


def _from_content(table: Table) -> Dict[str, Dict[str, Set[str]]]:
    from dataclasses import replace

    old = keyed_rows(replace(table, row_ids=None).row_fingerprints())
    keys = _unchanged(table)
    keys["row"] = _mapping(([k] for k in old), keyed_rows(table.row_fingerprints()))
    return keys


def _marks(layout: str) -> str:
    return next((p for p in layout.split(";") if p.startswith(f"{INTEGER_IDS}=")), "")


def migrate(spec: specs.RunSpec, ledger_url: str) -> Dict[str, int]:
    """Re-key ``spec``'s dataset in the ledger at ``ledger_url`` (the owner's) from the identity its runs
    recorded to the one ``spec``'s source has now; what was re-keyed, by kind, or {} when they agree."""
    from flows.ledger import PrivacyLedger

    table = source_table(spec)
    layout = f"{table.layout};{KEYED_ROWS}"
    ledger = PrivacyLedger.open(ledger_url)
    recorded = ledger.row_layout(spec.budget.dataset)
    if recorded is None or recorded == layout:
        return {}
    legacy = f"{legacy_identity_layout(table.layout)};{KEYED_ROWS}"
    content = content_layout(table, getattr(spec.data.source, "label", ""))
    if recorded == legacy and legacy != layout:
        keys = legacy_keys(table)
    elif untyped_identity_layout(recorded) == untyped_identity_layout(layout) and not _marks(recorded):
        keys = _unchanged(table)  # recorded before identity types were: the same keys, now with their types
    elif untyped_identity_layout(recorded) == untyped_identity_layout(layout):
        keys = legacy_keys(table)  # integers then, text now (or back): each id's few possible texts
    elif table.row_ids is not None and content and recorded == f"{content};{KEYED_ROWS}":
        keys = _from_content(table)
    else:
        raise ValueError(f"--spec: dataset {spec.budget.dataset!r} recorded its rows as {recorded!r}, which this "
                         f"source ({layout!r}) cannot be matched to row by row; give the spec of a source holding "
                         "the same rows with the same features and label as those runs read")
    return ledger.migrate_ids(spec.budget.dataset, layout, recorded, keys["person"], keys["row"])
