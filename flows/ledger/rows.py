"""The rows and persons a dataset keeps private, across the ledger's datasets: refusing rows another dataset
keeps private as public or test rows (exposure) or as private rows of a second dataset (laundering), and
persons another dataset recorded; recording the block each row and person was first seen in; re-keying the
plain row hashes an earlier privzo wrote. Each runs inside a reservation's locked transaction."""
from __future__ import annotations

from typing import Iterable, Mapping, Optional, Sequence

from sqlalchemy import delete, func, insert, select, text
from sqlalchemy.orm import Session

from flows.ledger.errors import RowsExposed, RowsLaundered, RowsUnmatched, identity_changed, identity_of
from flows.ledger.schema import PrivateRowRow, RowBlockRow


def refuse_changed_identity(dataset: str, recorded: Optional[str], now: str) -> None:
    """Before any row is read: a run whose rows would be identified otherwise than its dataset's runs recorded
    (a row_id added or dropped, an identity column now text where it was integers) is refused naming the
    identity and the owner's re-keying (``RowsUnmatched``). Layouts of an earlier privzo's are left to the
    reservation, which knows how to take them."""
    from components.data.table import IDS_AS_WRITTEN, INTEGER_IDS

    parts = recorded.split(";") if recorded is not None else []  # flows/record/tracking.py KEYED_ROWS marks keyed rows
    earlier = "rows=hmac-sha256" not in parts or (recorded.partition(":")[2].startswith("row_id=") and
                                            IDS_AS_WRITTEN not in parts)
    if recorded is None or recorded == now or earlier:
        return
    if identity_of(recorded) != identity_of(now) and (f";{INTEGER_IDS}=" in recorded or
                                                      identity_of(recorded, types=False) != identity_of(now, types=False)):
        raise RowsUnmatched(dataset, recorded, now, reason=identity_changed(dataset, recorded, now))


def lock_rows(session: Session) -> None:
    """PostgreSQL: the ledger-wide lock a reservation takes (after its dataset's) before it reads other
    datasets' rows and persons and records its own (SQLite's BEGIN IMMEDIATE already locks the file).
    Taken second, and only here, so it waits on no other lock: no deadlock, and a reservation's budget
    arithmetic is not serialised with other datasets'."""
    if session.get_bind().dialect.name == "postgresql":  # the two-key space: apart from the datasets' locks
        session.execute(text("SELECT pg_advisory_xact_lock(hashtext('privzo'), hashtext('rows of every "
                             "dataset'))"))


def held_elsewhere(session: Session, dataset: str, keys: Iterable[str], column, where) -> Optional[tuple]:
    """(the other dataset holding most of ``keys`` in ``column``, how many of them it holds), or None."""
    ordered, counts = sorted(keys), {}
    table = column.class_
    for start in range(0, len(ordered), 500):  # SQLite caps the parameters of one statement
        for other, n in session.execute(
                select(table.dataset, func.count()).where(column.in_(ordered[start:start + 500]),
                                                          table.dataset != dataset, *where)
                .group_by(table.dataset)):
            counts[other] = counts.get(other, 0) + n
    if not counts:
        return None
    other = max(sorted(counts), key=counts.get)
    return other, int(counts[other])


def refuse_exposed_elsewhere(session: Session, dataset: str, rows: set) -> None:
    """Refuse public or test rows that another dataset of the ledger keeps private: used without noise
    under one name, they would expose people whose privacy another name's runs spent."""
    found = held_elsewhere(session, dataset, rows, PrivateRowRow.row, ())
    if found is not None:
        raise RowsExposed(dataset, found[1], other=found[0])


def refuse_laundering(session: Session, dataset: str, rows: set) -> None:
    """Refuse rows already private under another dataset name (keyed fingerprints share one key)."""
    found = held_elsewhere(session, dataset, rows, PrivateRowRow.row, ())
    if found is not None:
        raise RowsLaundered(dataset, found[0], found[1])


def refuse_laundered_persons(session: Session, dataset: str, persons: Sequence[str]) -> None:
    """Refuse persons (keyed ids of data.blocks.person) another dataset of the ledger recorded: matched on
    who they are, not on their rows' content, so rows written another way do not make them new people."""
    found = held_elsewhere(session, dataset, persons, RowBlockRow.key, (RowBlockRow.kind == "person",))
    if found is not None:
        raise RowsLaundered(dataset, found[0], found[1], persons=True)


def record_blocks(session: Session, dataset: str, kind: str, seen: Mapping[str, str],
                  recorded: Mapping[str, str]) -> None:
    """Record the block of every row (person, ``kind``) in ``seen`` that has none in ``recorded`` yet; refuse
    a run one of whose rows was recorded in another block since it read the ledger."""
    moved = [k for k, b in seen.items() if k in recorded and recorded[k] != b]
    if moved:
        raise RowsUnmatched(dataset, "", "", reason=(
            f"data.blocks: {len(moved)} {kind}s of this run were recorded in other blocks by a run that saw them "
            f"first while this one was loading; run again, so that it reads them in their recorded blocks"))
    new = sorted(k for k in seen if k not in recorded)
    if new:
        session.execute(insert(RowBlockRow), [{"dataset": dataset, "kind": kind, "key": k, "block": seen[k]}
                                              for k in new])


def rekey(session: Session, dataset: str, keyed: Mapping[str, str]) -> None:
    """Replace the dataset's plain row hashes by their keyed forms; refuse (the caller's transaction
    rolls back) if a recorded row is not among this run's rows, since it could not be matched again."""
    stored = list(session.scalars(select(PrivateRowRow.row).where(PrivateRowRow.dataset == dataset)))
    if any(row not in keyed for row in stored):
        raise RowsUnmatched(dataset, "", "", reason=(
            f"data.source: dataset {dataset!r}'s ledger holds plain row hashes written by an earlier privzo, "
            "and some of those rows are not in this run's data, so they cannot be re-keyed; run once on data "
            "that still holds every row earlier runs kept private"))
    session.execute(delete(PrivateRowRow).where(PrivateRowRow.dataset == dataset))
    if stored:
        session.execute(insert(PrivateRowRow), [{"dataset": dataset, "row": keyed[r]} for r in sorted(stored)])


def rekey_ids(session: Session, dataset: str, persons: Mapping[str, Iterable[str]], rows: Mapping[str, Iterable[str]],
              person_level: bool) -> dict:
    """The dataset's recorded persons, row blocks and private rows under their keys as written (see
    ``PrivacyLedger.migrate_ids``). Persons, and rows without persons, must each be found; at person level a
    row's block is its person's, so a recorded row this data no longer holds is dropped; a private row no
    key maps is kept as it was (it is still matched by the laundering checks of rows written that way)."""
    counts = {}
    for kind, mapping, required in (("person", persons, True), ("row", rows, not person_level)):
        recorded = dict(session.execute(select(RowBlockRow.key, RowBlockRow.block).where(
            RowBlockRow.dataset == dataset, RowBlockRow.kind == kind)).all())
        lost = [k for k in recorded if k not in mapping]
        if required and lost:
            raise RowsUnmatched(dataset, "", "", reason=(
                f"budget migrate-ids: {len(lost)} of the {len(recorded)} {kind}s dataset {dataset!r} recorded are "
                f"not in this data, so their blocks could not be found again; run it on data holding every {kind} "
                "earlier runs recorded (the whole export, not a window of it)"))
        blocks: dict = {}
        for key, block in recorded.items():
            for new in mapping.get(key, ()):
                blocks[new] = min(blocks.get(new, block), block)
        session.execute(delete(RowBlockRow).where(RowBlockRow.dataset == dataset, RowBlockRow.kind == kind))
        if blocks:
            session.execute(insert(RowBlockRow), [{"dataset": dataset, "kind": kind, "key": k, "block": b}
                                                  for k, b in sorted(blocks.items())])
        counts[kind] = len(blocks)
    private = list(session.scalars(select(PrivateRowRow.row).where(PrivateRowRow.dataset == dataset)))
    kept = set()
    for row in private:
        kept.update(rows.get(row, (row,)))
    session.execute(delete(PrivateRowRow).where(PrivateRowRow.dataset == dataset))
    if kept:
        session.execute(insert(PrivateRowRow), [{"dataset": dataset, "row": k} for k in sorted(kept)])
    counts["private"] = len(kept)
    return counts
