"""``PrivacyLedger``: the ledger's reads and its state changes (register, reserve, commit, abort), each one
transaction; ``PrivacyLedger.open``, the process's one ledger per URL; ``ledger_for_spending``, the ledger a
run that spends budget signs in to before any row is read."""
from __future__ import annotations

import dataclasses
import math
import os
import uuid
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence

import dp_accounting
from sqlalchemy import create_engine, event, insert, select, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, undefer, undefer_group
from sqlalchemy.pool import NullPool

from components.accountants import Accountant, event_from_json, event_to_json
from components.accountants.composed import ComposedState
from components.data.table import untyped_identity_layout
import flows.ledger.admission as admission
import flows.ledger.integrity as integrity
from flows.ledger.lease_book import LeaseBook
import flows.ledger.leases as leases
import flows.ledger.migrations as migrations
import flows.ledger.opened as opened
import flows.ledger.outages as outages
import flows.ledger.roles as roles
import flows.ledger.rows as ledger_rows
from flows.ledger.errors import (FIXED, BlockRecordChanged, DatasetNotRegistered, LedgerUnavailable,
                                 RowsExposed, RowsUnmatched, driver_reason, identity_types_not_recorded,
                                 ids_not_migrated, shown_url)
from flows.ledger.records import Block, Charge
from flows.ledger.reservation import Reservation
from flows.ledger.schema import (ABORTED, COMMITTED, NO_BLOCKS, RESERVED, WHOLE, BlockRow, ChargeBlockRow, ChargeRow,
                                 DatasetRow, PrivateRowRow, RowBlockRow, RowLayoutRow, utc_now)
from flows.ledger.terms import BlockTerms, DatasetTerms, term_values
from specs.sections import default_ledger


def ledger_for_spending(url: str, terms: Optional[DatasetTerms] = None) -> "PrivacyLedger":
    """The ledger at ``url``, once it has signed the caller in and granted what a charge writes, and, given
    ``terms``, once the dataset is registered with them (or this role may register it); raises
    ``LedgerUnavailable`` (``DatasetNotRegistered``) or ValueError (other terms) in one line otherwise: a
    wrong password, a read-only role or file, a worker's run on a dataset nobody registered."""
    from sqlalchemy.exc import SQLAlchemyError

    where = shown_url(url)
    try:
        ledger = PrivacyLedger.open(url)
        missing = ledger.missing_write_grants()
        if not missing and terms is not None:
            ledger.check_registration(terms)
    except SQLAlchemyError as err:
        raise LedgerUnavailable(where, driver_reason(err)) from None
    except OSError as err:
        raise LedgerUnavailable(where, err.strerror or str(err)) from None
    if missing:
        raise LedgerUnavailable(where, f"this role may not write {missing[0]}")
    return ledger


@outages.ride_out(also=("_reserve",), besides=("reserve",))  # reserve chooses the charge id, _reserve is its transaction
class PrivacyLedger(LeaseBook):
    """The ledger at a database URL. ``PrivacyLedger(url)`` opens it anew (an engine, the tables made and
    migrated); ``PrivacyLedger.open(url)`` is the process's one ledger at ``url``, which a run's steps share.
    ``pooled``: False for a shared one, which holds no connection between transactions (see ``open``)."""

    def __init__(self, url: str, *, pooled: bool = True):
        self.url = url
        if url == default_ledger():  # this user's ledger: its folder is made on first use
            os.makedirs(os.path.dirname(url.split(":///", 1)[1]), mode=0o700, exist_ok=True)
        options = self._engine_options(url)
        if not pooled:
            options["poolclass"] = NullPool
        self.engine: Engine = create_engine(url, future=True, **options)
        if self.engine.dialect.name == "sqlite":
            @event.listens_for(self.engine, "connect")
            def _sqlite(dbapi_connection, _record):  # noqa: ANN001 - DB-API connection
                dbapi_connection.isolation_level = None  # we issue BEGIN IMMEDIATE ourselves
                dbapi_connection.execute("PRAGMA busy_timeout = 60000")
                dbapi_connection.execute("PRAGMA foreign_keys = ON")  # a block's terms are its dataset's

            @event.listens_for(self.engine, "begin")
            def _begin(conn):  # noqa: ANN001
                conn.exec_driver_sql("BEGIN IMMEDIATE")  # take the write lock before reading the total
        self.terms_kept = migrations.prepare(self.engine)  # the tables made, an earlier privzo's migrated

    @classmethod
    def open(cls, url: str) -> "PrivacyLedger":
        """The process's one ledger at ``url``, opened (engine, tables made, migrated) by its first caller and
        shared by the rest, so a run's many steps use one engine and make and migrate the tables once. Opened
        anew where sharing would not be the same ledger: a SQLite file removed or replaced since (or a
        relative path that now names another file), a forked process (an engine is its maker's process's),
        a ledger whose tables predated its terms when opened (its owner may have migrated it
        since), and an in-memory SQLite URL every time (each engine is a database of its own). The shared
        ledger keeps no connection open between transactions: each connects anew, as a ledger opened per
        call did, so a role whose rights changed, or was dropped and made again, and a restarted server
        are met as they are now, and an idle process holds no connection to the server."""
        return opened.shared(url, lambda at, pooled: cls(at, pooled=pooled))

    def missing_write_grants(self) -> List[str]:
        """What of the ledger this connection may not write as a charge does (``roles.missing_write_grants``)."""
        return roles.missing_write_grants(self.engine)

    def may_register(self) -> bool:
        """Whether this connection may register datasets (``roles.may_register``)."""
        return roles.may_register(self.engine)

    def check_registration(self, terms: DatasetTerms) -> None:
        """Before any row is read: the dataset is registered with ``terms``, or unregistered and this role may
        register it (its first run then does); raises ``DatasetNotRegistered``, ``LedgerUnavailable`` or
        ValueError (one line naming the registered term) otherwise."""
        self._terms_columns_kept()
        with Session(self.engine) as session:  # reads only: closed, it rolls back
            ds = session.get(DatasetRow, terms.dataset)
            if ds is None:
                if not self.may_register():
                    raise DatasetNotRegistered(terms.dataset, shown_url(self.url))
                return
            admission.check_terms(ds, terms.lifetime_epsilon, terms.accountant, terms.neighboring)
            self._settle_terms(session, ds, terms, terms.period is not None, adopt=False)

    def register(self, terms: DatasetTerms) -> bool:
        """Register ``terms.dataset`` with its terms (the owner's act); False if it already is, with the same
        ones. Raises ValueError naming the registered terms if they differ: a lifetime is never changed, so
        what runs were admitted under stays what the dataset's guarantee is. A dataset registered before its
        block terms were kept takes ``terms``' (True), if they agree with what the ledger holds for it."""
        if terms.delta is None:
            raise ValueError("budget init: a lifetime's delta is a number (privacy.delta auto is 1/N of one run; "
                             "give --delta)")
        self._terms_columns_kept()
        with Session(self.engine) as session, session.begin():
            ds = self._lock(session, terms.dataset)
            if ds is not None:
                if not (math.isclose(ds.lifetime_epsilon, terms.lifetime_epsilon) and ds.delta == terms.delta
                        and ds.accountant == terms.accountant and ds.neighboring == terms.neighboring):
                    raise ValueError(
                        f"budget init: dataset {terms.dataset!r} is registered with lifetime epsilon "
                        f"{ds.lifetime_epsilon:g} at delta {ds.delta:g}, {ds.accountant}, {ds.neighboring}; a "
                        "registered lifetime is never changed: the same people keep it (a new dataset name is for other "
                        "people's rows)")
                unset = ds.blocks is None
                self._settle_terms(session, ds, terms, terms.period is not None, adopt=True)
                return unset
            Accountant(terms.accountant, terms.neighboring)  # an unknown accountant fails here, not in a run
            session.add(DatasetRow(dataset=terms.dataset, lifetime_epsilon=terms.lifetime_epsilon, delta=terms.delta,
                                   accountant=terms.accountant, neighboring=terms.neighboring,
                                   **term_values(terms)))
            return True

    def _terms_columns_kept(self) -> None:
        if not self.terms_kept:
            raise LedgerUnavailable(shown_url(self.url), "its tables predate the dataset terms and reservation leases "
                                    "it keeps; its owner adds them by opening it once, e.g. privzo budget grant ROLE "
                                    "--ledger OWNER_URL")

    def _settle_terms(self, session: Session, ds: DatasetRow, terms: Optional[DatasetTerms], has_blocks: bool,
                      adopt: bool) -> None:
        """Refuse (ValueError, one line) a run whose block terms are not ``ds``'s: ``terms`` all of them, or,
        None (a caller of ``reserve`` that gives none), whether it reads blocks (``has_blocks``). A dataset
        registered before they were kept (NULL) is held to what the ledger recorded of it (its blocks, their
        declared sizes, its persons) and, ``adopt`` and ``terms`` given, takes ``terms`` in ``session``: on
        PostgreSQL only its owner may (a worker's run is refused before any row is read)."""
        self._terms_columns_kept()
        name = ds.dataset
        if ds.blocks is not None:
            if terms is not None:
                problem = admission.terms_problem(ds, terms)
            else:
                problem = admission.blocks_problem(name, ds.blocks, ds.person, ds.declared,
                                                   (ds.blocks if ds.blocks != NO_BLOCKS else "?") if has_blocks
                                                   else None, ds.person, ds.declared)
            if problem:
                raise ValueError(problem)
            return
        problem = self._recorded_problem(session, name, terms, has_blocks)
        if problem:
            raise ValueError(problem)
        if terms is None:
            return
        if not self.may_register():  # terms are the owner's to set, also a first time
            raise DatasetNotRegistered(name, shown_url(self.url), "has no block terms yet (it was registered "
                                       "before they were kept)")
        if adopt:
            for column, value in term_values(terms).items():
                setattr(ds, column, value)

    @staticmethod
    def _recorded_problem(session: Session, name: str, terms: Optional[DatasetTerms],
                          has_blocks: bool) -> Optional[str]:
        """Why a dataset registered before its block terms were kept cannot take ``terms`` (or, None, a run
        that reads blocks or not), from what the ledger recorded of it; None if nothing contradicts them."""
        from components.periods import block_start

        named = list(session.scalars(select(BlockRow.block).where(BlockRow.dataset == name).order_by(BlockRow.block)))
        periods = [b for b in named if b != WHOLE]
        whole = WHOLE in named or (not named and session.scalars(
            select(ChargeRow.id).where(ChargeRow.dataset == name)).first() is not None)
        if periods and not has_blocks:
            return (f"data.blocks: dataset {name!r} has blocks in the ledger ({periods[0]} ...), each with a lifetime "
                    f"of its own, the spec has none; {FIXED}")
        if whole and has_blocks:
            return (f"data.blocks: dataset {name!r} was charged without blocks (one lifetime for all its rows), the "
                    f"spec has data.blocks; {FIXED}")
        if terms is None or terms.period is None:
            return None
        for block in periods:
            try:
                block_start(block, terms.period)
            except ValueError:
                return (f"data.blocks.period: dataset {name!r} has block {block!r} in the ledger, which is not a "
                        f"{terms.period}; {FIXED}")
        kinds = set(session.scalars(select(RowBlockRow.kind).where(RowBlockRow.dataset == name).distinct()))
        if "person" in kinds and not terms.person:
            return (f"data.blocks.person: dataset {name!r} has persons recorded in the ledger (person level), the "
                    f"spec has none; {FIXED}")
        if kinds and "person" not in kinds and terms.person:
            return (f"data.blocks.person: dataset {name!r} was charged event level (no person recorded in the ledger), "
                    f"the spec has {terms.person!r}; {FIXED}")
        declared = sorted(set(session.scalars(select(BlockRow.rows).where(
            BlockRow.dataset == name, BlockRow.rows.is_not(None)))) - {terms.declared})
        if declared:
            field, unit = ("declared_persons", "persons") if terms.person else ("declared_private_rows", "rows")
            return (f"data.blocks.{field}: dataset {name!r} has blocks declared with {declared[0]} {unit} in the "
                    f"ledger, the spec says {terms.declared}; {FIXED}")
        return None

    def grant(self, role: str, read_only: bool = False) -> List[str]:
        """Give ``role`` a worker's rights or, ``read_only``, a viewer's (``roles.grant``); the statements run."""
        return roles.grant(self.engine, role, read_only)

    @staticmethod
    def _engine_options(url: str) -> dict:
        if url.startswith("sqlite"):
            return {"connect_args": {"timeout": 60, "check_same_thread": False}}
        # READ COMMITTED whatever the server's default: under REPEATABLE READ a reservation's snapshot is
        # taken by its first statement, the lock wait itself, so a run that waited for another's
        # reservation would read the total from before it and both could pass the budget check
        return {"pool_pre_ping": True, "isolation_level": "READ COMMITTED"}

    # ---------------------------------------------------------------- queries
    def _charges(self, session: Session, dataset: str) -> List[ChargeRow]:
        return list(session.scalars(select(ChargeRow).where(ChargeRow.dataset == dataset)
                                    .order_by(ChargeRow.created_at)))

    @staticmethod
    def _live_event(row: ChargeRow, accountant: str = "") -> Optional[dp_accounting.DpEvent]:
        """What a charge counts as: executed once committed (planned under pld), planned while reserved."""
        if row.status == ABORTED:
            return None
        counted = row.executed_event if row.status == COMMITTED and accountant != "pld" else row.planned_event
        return event_from_json(counted)

    def _epsilon(self, ds: DatasetRow, events: List[dp_accounting.DpEvent]) -> float:
        if not events:
            return 0.0
        return Accountant(ds.accountant, ds.neighboring).epsilon(dp_accounting.ComposedDpEvent(events), ds.delta)

    def spent(self, dataset: str) -> float:
        """The dataset's guarantee: the largest over its blocks of the composed epsilon of every committed and
        reserved charge on the block, at the block's delta."""
        with Session(self.engine) as session, session.begin():
            ds = session.get(DatasetRow, dataset)
            if ds is None:
                return 0.0
            blocks = self._block_rows(session, dataset)
            if not blocks:  # charged before blocks: one block, not yet written as one
                events = [e for e in (self._live_event(r, ds.accountant) for r in self._charges(session, dataset))
                          if e is not None]
                return self._epsilon(ds, events)
            return max(self._block_epsilon(session, b) for b in blocks)

    def blocks(self, dataset: str) -> List[Block]:
        """The dataset's blocks in the order they were first charged."""
        with Session(self.engine) as session, session.begin():
            ds = session.get(DatasetRow, dataset)
            if ds is None:
                return []
            rows = self._block_rows(session, dataset)
            if not rows:
                charges = [r for r in self._charges(session, dataset) if r.status != ABORTED]
                committed = [self._live_event(r, ds.accountant) for r in charges if r.status == COMMITTED]
                live = [self._live_event(r, ds.accountant) for r in charges]
                return [Block(dataset, WHOLE, ds.lifetime_epsilon, ds.delta, None, self._epsilon(ds, committed),
                              self._epsilon(ds, live), len(charges),
                              min((r.created_at for r in charges), default=utc_now()))]
            out = []
            for b in rows:
                linked = self._linked(session, b)
                out.append(Block(dataset, b.block, b.lifetime_epsilon, b.delta, b.rows,
                                 b.committed_epsilon, self._block_epsilon(session, b),
                                 sum(1 for r in linked if r.status != ABORTED), b.created_at))
            return out

    def recomposed(self, dataset: str) -> List[tuple]:
        """Per stored block of ``dataset``: (block, its stored committed epsilon, the epsilon of its stored
        composition, the epsilon its committed charges compose to, how many they are), at the block's delta.
        The charges are folded as ``commit`` folds them, one after another in the order they were settled."""
        out = []
        with Session(self.engine) as session, session.begin():
            ds = session.get(DatasetRow, dataset)
            if ds is None:
                return []
            for b in session.scalars(select(BlockRow).where(BlockRow.dataset == dataset)
                                     .options(undefer(BlockRow.committed)).order_by(BlockRow.created_at, BlockRow.block)):
                fresh = ComposedState(Accountant(ds.accountant, ds.neighboring))
                state, n = fresh, 0
                for r in sorted(self._linked(session, b), key=lambda r: (r.updated_at, r.created_at)):
                    if r.status == COMMITTED:
                        state, n = state.plus(fresh.composed([self._live_event(r, ds.accountant)])), n + 1
                out.append((b.block, b.committed_epsilon, ComposedState.from_json(b.committed).epsilon(b.delta),
                            state.epsilon(b.delta) if n else 0.0, n))
        return out

    def recorded_blocks(self, dataset: str, kind: str, keys: Iterable[str]) -> Dict[str, str]:
        """The blocks recorded for ``keys`` (keyed row fingerprints, or keyed persons: ``kind`` row | person)."""
        wanted = set(keys)
        with Session(self.engine) as session:
            found = session.execute(select(RowBlockRow.key, RowBlockRow.block).where(
                RowBlockRow.dataset == dataset, RowBlockRow.kind == kind))
            return {k: b for k, b in found if k in wanted}

    def next_fit(self, dataset: str) -> Optional[float]:
        """The largest epsilon a run shaped like the dataset's last charge (its noise scaled) can have and still
        fit every block that charge read; None when the dataset has no charge or nothing fits."""
        with Session(self.engine) as session, session.begin():
            charges = [r for r in self._charges(session, dataset) if r.status != ABORTED]
            ds = session.get(DatasetRow, dataset)
            if not charges or ds is None:
                return None
            last = charges[-1]
            read = set(session.scalars(select(ChargeBlockRow.block).where(ChargeBlockRow.charge_id == last.id)))
            rows = [b for b in self._block_rows(session, dataset) if b.block in read]
            planned = event_from_json(last.planned_event)
            if not rows:  # charged before blocks: the history is the one block
                events = [e for e in (self._live_event(r, ds.accountant) for r in charges) if e is not None]
                base = ComposedState(Accountant(ds.accountant, ds.neighboring)).composed(events)
                return admission.largest_fit([(base, ds.lifetime_epsilon, ds.delta)], planned, 20)
            return admission.largest_fit([(self._with_open(session, b), b.lifetime_epsilon, b.delta) for b in rows],
                                         planned, 20)

    # ---------------------------------------------------------------- blocks
    @staticmethod
    def _block_rows(session: Session, dataset: str) -> List[BlockRow]:
        return list(session.scalars(select(BlockRow).where(BlockRow.dataset == dataset)
                                    .order_by(BlockRow.created_at, BlockRow.block)))

    @staticmethod
    def _linked(session: Session, block: BlockRow) -> List[ChargeRow]:
        return list(session.scalars(
            select(ChargeRow).join(ChargeBlockRow, ChargeBlockRow.charge_id == ChargeRow.id)
            .where(ChargeBlockRow.dataset == block.dataset, ChargeBlockRow.block == block.block)
            .order_by(ChargeRow.created_at)))

    def _refuse_a_changed_record(self, session: Session, ds: DatasetRow, block: BlockRow) -> None:
        """Admission reads a block's stored composition; it must be what the block's committed charges compose
        to (``privzo budget show --check``'s recomposition, ``integrity.recomposed_epsilon``), else nothing is
        admitted on it."""
        counted = "planned_event" if ds.accountant == "pld" else "executed_event"
        events = [getattr(r, counted) for r in sorted(self._linked(session, block),
                                                      key=lambda r: (r.updated_at, r.created_at))
                  if r.status == COMMITTED]
        recomposed = integrity.recomposed_epsilon(ds.accountant, ds.neighboring, events, block.delta)
        stored = ComposedState.from_json(block.committed).epsilon(block.delta)
        for value in (stored, block.committed_epsilon):
            if not math.isclose(value, recomposed, rel_tol=1e-6, abs_tol=1e-9):
                raise BlockRecordChanged(ds.dataset, block.block, value, recomposed, len(events))

    def _block_epsilon(self, session: Session, block: BlockRow) -> float:
        """The block's epsilon with its open reservations; its stored committed one when it has none (a large
        PLD state is then not even read)."""
        has_open = session.scalars(
            select(ChargeRow.id).join(ChargeBlockRow, ChargeBlockRow.charge_id == ChargeRow.id)
            .where(ChargeBlockRow.dataset == block.dataset, ChargeBlockRow.block == block.block,
                   ChargeRow.status == RESERVED)).first() is not None
        return self._with_open(session, block).epsilon(block.delta) if has_open else block.committed_epsilon

    def _with_open(self, session: Session, block: BlockRow) -> ComposedState:
        """The block's committed composition followed by its open reservations' planned events."""
        reserved = session.scalars(
            select(ChargeRow.planned_event).join(ChargeBlockRow, ChargeBlockRow.charge_id == ChargeRow.id)
            .where(ChargeBlockRow.dataset == block.dataset, ChargeBlockRow.block == block.block,
                   ChargeRow.status == RESERVED).order_by(ChargeRow.created_at))
        return ComposedState.from_json(block.committed).composed([event_from_json(e) for e in reserved])

    def _blocks_written(self, session: Session, ds: DatasetRow) -> None:
        """A dataset charged before blocks existed becomes its one block: its committed charges composed in
        the order they were made, every charge linked to it. Runs inside the caller's locked transaction."""
        if session.scalars(select(BlockRow.block).where(BlockRow.dataset == ds.dataset)).first() is not None:
            return
        charges = self._charges(session, ds.dataset)
        if not charges:
            return
        counted = "planned_event" if ds.accountant == "pld" else "executed_event"  # as commit folds them
        committed = ComposedState(Accountant(ds.accountant, ds.neighboring)).composed(
            [event_from_json(getattr(r, counted)) for r in charges if r.status == COMMITTED])
        session.add(BlockRow(dataset=ds.dataset, block=WHOLE, lifetime_epsilon=ds.lifetime_epsilon, delta=ds.delta,
                             rows=None, committed=committed.to_json(), committed_epsilon=committed.epsilon(ds.delta),
                             created_at=min(r.created_at for r in charges)))
        session.execute(insert(ChargeBlockRow), [{"charge_id": r.id, "block": WHOLE, "dataset": ds.dataset}
                                                 for r in charges])
        session.flush()

    def dataset(self, dataset: str) -> Optional[DatasetRow]:
        with Session(self.engine) as session:
            row = session.get(DatasetRow, dataset, options=[undefer_group("terms")] if self.terms_kept else [])
            if row is not None:
                session.expunge(row)
            return row

    def history(self, dataset: str) -> List[Charge]:
        with Session(self.engine) as session, session.begin():
            return self._charges_of(session, self._charges(session, dataset), ChargeRow.dataset == dataset)

    def run_charges(self, run_id: str) -> List[Charge]:
        """Every charge recorded for the MLflow run ``run_id``, on any dataset, oldest first."""
        where = ChargeRow.run_id == run_id
        with Session(self.engine) as session, session.begin():
            rows = list(session.scalars(select(ChargeRow).where(where).order_by(ChargeRow.created_at)))
            return self._charges_of(session, rows, where)

    def _charges_of(self, session: Session, rows: List[ChargeRow], where) -> List[Charge]:
        """``rows`` as the ledger's reads return them, with the blocks each is recorded on (one query, ``where``
        selecting the same charges)."""
        blocks: Dict[str, List[str]] = {}
        for charge_id, block in session.execute(select(ChargeBlockRow.charge_id, ChargeBlockRow.block)
                                                .join(ChargeRow, ChargeRow.id == ChargeBlockRow.charge_id).where(where)):
            blocks.setdefault(charge_id, []).append(block)
        out = []
        for r in rows:
            committed = r.status == COMMITTED
            planned = event_from_json(r.planned_event)
            executed = event_from_json(r.executed_event) if committed and r.executed_event else None
            out.append(Charge(r.id, r.dataset, r.fingerprint, r.run_name, r.run_id, r.status, r.steps_planned,
                              r.steps_run, r.planned_epsilon, planned if executed is None else executed, r.created_at, planned, executed,
                              tuple(sorted(blocks.get(r.id, ()))), self.url))
        return out

    def datasets(self) -> List[str]:
        with Session(self.engine) as session:
            return list(session.scalars(select(DatasetRow.dataset).order_by(DatasetRow.dataset)))

    def run_epsilon(self, charge: Charge) -> Optional[float]:
        """One charge's epsilon alone, at its dataset's delta (what it executed, or reserved while running);
        None for an aborted one, which counts for nothing."""
        if charge.status == ABORTED:
            return None
        ds = self.dataset(charge.dataset)
        return Accountant(ds.accountant, ds.neighboring).epsilon(charge.event, ds.delta)

    def charged_run(self, dataset: str, run_id: str) -> bool:
        """Whether the MLflow run ``run_id`` was charged (reserved or committed) to ``dataset``."""
        with Session(self.engine) as session:
            charge = session.scalars(select(ChargeRow.id).where(
                ChargeRow.dataset == dataset, ChargeRow.run_id == run_id, ChargeRow.status != ABORTED)).first()
            return charge is not None

    def status(self, charge_id: str) -> Optional[str]:
        """reserved / committed / aborted, or None for an unknown charge."""
        with Session(self.engine) as session:
            row = session.get(ChargeRow, charge_id)
            return None if row is None else row.status

    # ---------------------------------------------------------------- state changes
    def reserve(self, reservation: Reservation) -> str:
        """Reserve ``reservation.planned`` on its dataset if the composed total stays within its lifetime epsilon
        and no row of its ``exposed_rows`` (the run's public and test rows) was private in an earlier run on any
        dataset of the ledger; records its ``private_rows``, refusing any that another dataset holds private
        (and, with ``person_blocks``, any person another dataset recorded). Returns the charge id, or raises
        ``BudgetExceeded`` / ``RowsExposed`` / ``RowsUnmatched`` / ValueError (terms) having written nothing.
        Rows of a reservation later aborted stay recorded. What each field asks: ``Reservation``."""
        from sqlalchemy.exc import DBAPIError

        if reservation.charge_id is None:  # chosen once, so a retried transaction finds the charge it wrote
            reservation = dataclasses.replace(reservation, charge_id=str(uuid.uuid4()))
        try:
            return self._reserve(reservation)
        except admission.NoRoom as no_room:  # its figures composed now, the dataset's lock released
            raise no_room.refused() from None
        except DBAPIError as err:
            # a role refused a write mid-reservation (a worker re-keying a dataset's rows: the owner's act);
            # the transaction rolled back, so nothing was written
            if "permission denied" not in driver_reason(err) and "violates foreign key" not in driver_reason(err):
                raise
            raise LedgerUnavailable(shown_url(self.url), driver_reason(err)) from None

    def _reserve(self, r: Reservation) -> str:
        dataset, planned, terms, rows, window_read = r.dataset, r.planned, r.given_terms, r.rows, r.window
        blocks = None if window_read is None else window_read.blocks
        row_blocks = None if window_read is None else window_read.row_blocks
        person_blocks = None if window_read is None else window_read.person_blocks
        row_layout = rows.layout
        self._terms_columns_kept()
        with Session(self.engine) as session, session.begin():
            ds = self._lock(session, dataset)
            again = session.get(ChargeRow, r.charge_id) if r.charge_id and ds is not None else None
            if again is not None and (again.dataset, again.fingerprint, again.status) == (dataset, r.fingerprint,
                                                                                          RESERVED):
                return again.id  # a retry (flows/ledger/outages.py) of a reservation whose commit went through
            if ds is None:
                if not self.may_register():
                    raise DatasetNotRegistered(dataset, shown_url(self.url))
                ds = DatasetRow(dataset=dataset, lifetime_epsilon=r.terms.lifetime_epsilon, delta=r.terms.delta,
                                accountant=r.terms.accountant, neighboring=r.terms.neighboring, **term_values(terms))
                session.add(ds)
                session.flush()
            else:
                admission.check_terms(ds, r.terms.lifetime_epsilon, r.terms.accountant, r.terms.neighboring)
            self._settle_terms(session, ds, terms, blocks is not None, adopt=True)
            admission.check_supported(ds, planned)
            self._blocks_written(session, ds)
            self._settle_expired(session, ds)  # a dead run's reservation holds no budget past its lease
            window, requested = self._admit(session, ds, planned, blocks,
                                            *((None, None) if window_read is None else (window_read.next_block,
                                                                                       window_read.when)))
            recorded = session.get(RowLayoutRow, dataset)
            if recorded is None:
                session.add(RowLayoutRow(dataset=dataset, layout=row_layout))
            elif recorded.layout != row_layout and rows.ids_legacy_layout is not None and \
                    recorded.layout == rows.ids_legacy_layout:
                raise ids_not_migrated(dataset)
            elif recorded.layout != row_layout and recorded.layout == untyped_identity_layout(row_layout):
                if not self.may_register():  # recorded before identity types were: the owner records them
                    raise identity_types_not_recorded(dataset)
                recorded.layout = row_layout
            elif recorded.layout != row_layout and rows.legacy_layout is not None and \
                    recorded.layout == rows.legacy_layout:
                ledger_rows.rekey(session, dataset, rows.legacy_rows or {})
                recorded.layout = row_layout
            elif recorded.layout != row_layout:
                raise RowsUnmatched(dataset, recorded.layout, row_layout)
            known = set(session.scalars(select(PrivateRowRow.row).where(PrivateRowRow.dataset == dataset)))
            exposed_rows, private_rows = set(rows.exposed), set(rows.private)
            recorded = {kind: dict(session.execute(select(RowBlockRow.key, RowBlockRow.block).where(
                RowBlockRow.dataset == dataset, RowBlockRow.kind == kind)).all()) for kind in ("row", "person")}
            if blocks is None:  # one lifetime for all its rows: a run that matches none of them is suspect
                admission.refuse_unrecognised_rows(dataset, known, private_rows, exposed_rows)
            else:  # a window of new blocks shares no row with earlier ones, and need not
                admission.refuse_unrecognised_blocks(dataset, row_blocks or {}, person_blocks or {}, recorded)
            exposed = known.intersection(exposed_rows)
            if exposed:
                raise RowsExposed(dataset, len(exposed))
            new_rows = set(private_rows) - known
            new_persons = sorted(set(person_blocks or {}) - set(recorded["person"]))
            if exposed_rows or new_rows or new_persons:
                # what other datasets hold is read and claimed as one act: no other dataset's first run may
                # record the same rows or persons between this check and this transaction's commit
                ledger_rows.lock_rows(session)
                ledger_rows.refuse_exposed_elsewhere(session, dataset, exposed_rows - known)
                ledger_rows.refuse_laundering(session, dataset, new_rows)
                ledger_rows.refuse_laundered_persons(session, dataset, new_persons)
            if new_rows:
                session.execute(insert(PrivateRowRow), [{"dataset": dataset, "row": k} for k in sorted(new_rows)])
            for kind, seen in (("row", row_blocks), ("person", person_blocks)):
                if seen:
                    ledger_rows.record_blocks(session, dataset, kind, seen, recorded[kind])
            charge = ChargeRow(id=r.charge_id, dataset=dataset, fingerprint=r.fingerprint,
                               run_name=r.run_name, status=RESERVED, planned_event=event_to_json(planned),
                               steps_planned=r.steps, steps_run=0, planned_epsilon=requested, created_at=utc_now(),
                               updated_at=utc_now(), lease_until=leases.lease_end(utc_now()))
            session.add(charge)
            session.flush()
            session.execute(insert(ChargeBlockRow), [{"charge_id": charge.id, "block": b.block, "dataset": dataset}
                                                     for b in window])
            return charge.id

    def _admit(self, session: Session, ds: DatasetRow, planned: dp_accounting.DpEvent,
               blocks: Optional[Sequence[BlockTerms]], next_block: Optional[str] = None,
               when: Optional[Callable[[List[str]], str]] = None):
        """The window's block rows (new ones added to ``session``) and the planned run's epsilon, if every block
        can take ``planned``; raises ``admission.NoRoom`` (its caller makes the refusal once the lock is released)
        or ValueError otherwise. Reads and adds the rows; what fits is ``admission``'s."""
        dataset = ds.dataset
        increment = admission.planned_increment(ds, planned)  # planned once, added to every block
        requested = increment.epsilon(ds.delta)
        window, full = [], []
        for terms in admission.window_terms(blocks, ds):
            if ds.accountant == "pld":
                self._refuse_another_event(session, dataset, terms.block, planned)
            row = session.get(BlockRow, (dataset, terms.block))
            admission.check_block_terms(dataset, row if row is not None else ds, terms)  # a new block: its dataset's
            if row is None:
                row = BlockRow(dataset=dataset, block=terms.block, lifetime_epsilon=ds.lifetime_epsilon,
                               delta=ds.delta, rows=terms.rows,
                               committed=ComposedState(Accountant(ds.accountant, ds.neighboring)).to_json(),
                               committed_epsilon=0.0, created_at=utc_now())
                session.add(row)
            else:
                self._refuse_a_changed_record(session, ds, row)
            over = admission.full_block(row, self._with_open(session, row), increment)
            if over is not None:
                full.append(over)
            window.append(row)
        if full:
            raise admission.NoRoom(dataset, ds.accountant, planned, requested, full, next_block, when)
        return window, requested

    def blocks_with_room(self, dataset: str, candidates: Sequence[BlockTerms], planned: dp_accounting.DpEvent,
                         limit: int) -> List[str]:
        """The first ``limit`` of ``candidates``, in their order, that can take ``planned`` (with their committed
        charges and open reservations; under pld, only a block whose runs plan this same event). Reads the
        ledger's charges only, never a row: how a window with_budget chooses its blocks."""
        chosen: List[str] = []
        with Session(self.engine) as session:
            ds = session.get(DatasetRow, dataset)
            for terms in candidates:
                if len(chosen) == limit:
                    break
                if ds is None:
                    chosen.append(terms.block)
                    continue
                try:
                    self._admit(session, ds, planned, [terms])
                except (admission.NoRoom, ValueError):
                    continue
                chosen.append(terms.block)
            session.rollback()  # blocks _admit added are registered by the reservation, not here
        return chosen

    def preview(self, dataset: str, planned: dp_accounting.DpEvent, blocks: Sequence[BlockTerms],
                next_block: Optional[str] = None) -> None:
        """Raise what ``reserve`` would raise for ``planned`` on ``blocks`` for lack of budget, writing nothing."""
        with Session(self.engine) as session:
            ds = session.get(DatasetRow, dataset)
            if ds is not None:
                try:
                    self._admit(session, ds, planned, blocks, next_block)
                except admission.NoRoom as no_room:  # no lock here: a read
                    raise no_room.refused() from None
                finally:
                    session.rollback()

    @staticmethod
    def _refuse_another_event(session: Session, dataset: str, block: str, planned: dp_accounting.DpEvent) -> None:
        """Under pld, a block takes copies of one planned event only (see flows.ledger.admission's note on
        filters)."""
        others = session.scalars(
            select(ChargeRow.id).join(ChargeBlockRow, ChargeBlockRow.charge_id == ChargeRow.id)
            .where(ChargeBlockRow.dataset == dataset, ChargeBlockRow.block == block, ChargeRow.status != ABORTED,
                   ChargeRow.planned_event != event_to_json(planned))).all()
        if others:
            raise admission.another_event(dataset, block, len(others))

    def _lock(self, session: Session, dataset: str) -> Optional[DatasetRow]:
        if self.engine.dialect.name == "postgresql":
            # serialise reservations, commits and the registration of one dataset (an advisory lock, not FOR
            # UPDATE: that needs UPDATE on the dataset's row, which a worker is not given)
            session.execute(text("SELECT pg_advisory_xact_lock(hashtext(:d))"), {"d": dataset})
            return session.scalars(select(DatasetRow).where(DatasetRow.dataset == dataset)).first()
        return session.get(DatasetRow, dataset)  # SQLite: BEGIN IMMEDIATE already holds the write lock

    def commit(self, charge_id: str, executed: dp_accounting.DpEvent, steps_run: int, run_id: Optional[str] = None) -> None:
        """Record what the run actually executed (all of it, or the steps before a crash)."""
        with Session(self.engine) as session, session.begin():
            row = session.get(ChargeRow, charge_id)
            if (row is not None and row.status == COMMITTED and row.steps_run == steps_run
                    and row.executed_event == event_to_json(executed)):
                return  # a retried commit whose first attempt went through
            if row is None or row.status != RESERVED:
                raise ValueError(f"ledger: charge {charge_id} is not reserved (status {row.status if row else None})")
            ds = self._lock(session, row.dataset)  # blocks' states are read, composed and written back
            self._fold(session, ds, row, event_to_json(executed), steps_run, run_id)

    def row_layout(self, dataset: str) -> Optional[str]:
        """What ``dataset``'s row fingerprints are computed from, as its first run recorded it (None before)."""
        with Session(self.engine) as session:
            recorded = session.get(RowLayoutRow, dataset)
            return None if recorded is None else recorded.layout

    def migrate_ids(self, dataset: str, layout: str, legacy_layout: str, persons: Mapping[str, Iterable[str]],
                    rows: Mapping[str, Iterable[str]]) -> Dict[str, int]:
        """Re-key a dataset whose person and row ids an earlier privzo read with type inference
        (``legacy_layout``) to its ids as written (``layout``), in one transaction; the owner's act (it
        replaces recorded keys, which no worker may). ``persons`` and ``rows``: each legacy key any row of the
        data could have had -> the keys as written of the rows that could have had it (keyed). A recorded
        person (or, without persons, row) among none of them is refused, since its block could not be found
        again; a legacy key several ids could have had gives each of them its block (the earliest, where
        two legacy keys give one id two), as the earlier reading did. Returns what was re-keyed, by kind."""
        with Session(self.engine) as session, session.begin():
            self._lock(session, dataset)
            recorded_layout = session.get(RowLayoutRow, dataset)
            if recorded_layout is None or recorded_layout.layout == layout:
                return {}
            if recorded_layout.layout != legacy_layout:
                raise RowsUnmatched(dataset, recorded_layout.layout, layout)
            ledger_rows.lock_rows(session)
            counts = ledger_rows.rekey_ids(session, dataset, persons, rows, person_level=bool(persons))
            recorded_layout.layout = layout
            return counts

    def abort(self, charge_id: str) -> None:
        """Release a reservation whose run never queried private data."""
        with Session(self.engine) as session, session.begin():
            row = session.get(ChargeRow, charge_id)
            if row is not None and row.status == RESERVED:
                row.status, row.updated_at = ABORTED, utc_now()
