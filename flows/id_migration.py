"""``privzo budget migrate-ids``: a dataset whose ledger an earlier privzo wrote, when a person's or a row's id
was read with pandas' type inference (``0065`` keyed as ``65`` while every id of the file was a number, as
``0065`` once one was not), re-keyed to the ids as written (components/data/identity.py), once, by the
ledger's owner, on data holding every person and row its runs recorded.

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
from components.data.table import Table, legacy_identity_layout
from flows.tracking import KEYED_ROWS, keyed_rows


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


def migrate(spec: specs.RunSpec, ledger_url: str) -> Dict[str, int]:
    """Re-key ``spec``'s dataset in the ledger at ``ledger_url`` (the owner's); what was re-keyed, by kind, or
    {} when there was nothing to migrate."""
    from flows.ledger import PrivacyLedger

    table = source_table(spec)
    layout = f"{table.layout};{KEYED_ROWS}"
    legacy = f"{legacy_identity_layout(table.layout)};{KEYED_ROWS}"
    if legacy == layout:
        raise ValueError(f"--spec: {spec.data.source.name} has no person or row_id column, so its ledger keys no id "
                         "to migrate")
    keys = legacy_keys(table)
    return PrivacyLedger.open(ledger_url).migrate_ids(spec.budget.dataset, layout, legacy, keys["person"], keys["row"])
