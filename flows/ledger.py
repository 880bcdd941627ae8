"""The privacy ledger: what every run has spent on each dataset, and refusal to overspend.

One row per run: dataset id and content fingerprint, the planned and the executed DpEvent (JSON),
status (reserved / committed / aborted) and steps run. A dataset's total is the exact composition of its
runs' events with dp-accounting (never a sum of epsilons): committed runs count with what they executed,
reserved runs with what they planned.

The ledger also keeps the content fingerprint of every row any run on a dataset treated as private, and
refuses a run that would use one of them as public or test data (both are used without noise), whichever
dataset of the ledger kept it private: a seed or split change between runs, new rows that move the split,
or another dataset name whose split marks those rows public, would otherwise expose people whose privacy
earlier runs have already spent. Rows private under one dataset are refused as private rows of another
(laundering), and with a person column (data.blocks.person) so are persons, matched on their keyed id.

Reservation is one transaction holding the dataset's lock (SQLite: ``BEGIN IMMEDIATE``, which locks the whole
file; PostgreSQL: an advisory lock on the dataset's name, and, since its row checks read other datasets'
rows, a ledger-wide one before them), so concurrent runs cannot both fit into the same remaining budget, nor
two datasets' first runs both claim the same rows.

A dataset's terms are fixed when it is registered (``DatasetTerms``): its lifetime epsilon and delta, the
accountant and neighbouring relation, and whether it has blocks, their period, its person column and the
persons or rows declared per block. A run whose spec differs in any of them is refused before any row is
read and again inside its reservation: dropping the window or the person column would otherwise give the
same rows a second lifetime. The terms are its owner's to
set. On PostgreSQL the ledger has roles (``grant``): the owner of its tables registers datasets
(``register``, ``privzo budget init``); a worker may read everything and charge registered datasets
(insert charges and blocks, move a charge from reserved to committed or aborted, fold it into its blocks)
but may not register or change a dataset, delete any row, or give a block other terms than its dataset's
(a foreign key ties every block to its dataset's lifetime and delta); a viewer only reads. A run whose role
may not register an unregistered dataset is refused before any row is read. A SQLite ledger is one
person's: whoever may write the file is its owner, and a dataset's first run registers it. A dataset
registered before the terms beyond its lifetime were kept adopts those of its next run (one the owner
runs, or its owner's ``privzo budget init --spec``), once, if they agree with the blocks, persons and rows
the ledger already holds for it.

Budgets belong to blocks of the dataset (docs/design.md, "Blocks"): a charge is recorded on every block
its run read, each block keeps the exact composition of its committed charges as a stored accountant
state (``ComposedState``), and a reservation composes the run's planned event onto that state and the
block's open reservations, so its cost does not grow with the block's history. A dataset's guarantee is
the maximum over its blocks. A dataset charged before blocks existed is one block, ``all``, made from its
charges the first time a reservation or commit touches it.

Admission is a privacy filter, sound when a later run's parameters are chosen after seeing earlier
models: under ``rdp`` a block admits a run while at least one of dp-accounting's fixed orders keeps the
composed Renyi divergence within what the lifetime (epsilon, delta) allows there, which is exactly
"dp-accounting's epsilon of the composition is within the lifetime" (the Renyi filter over fixed orders
of Lecuyer's "Practical privacy filters and odometers with Renyi differential privacy", the rule
PrivateKube applies to its blocks); under ``zcdp``, while the composed rho stays within the lifetime's
rho (a zCDP filter). Under ``pld`` the exact composition is a bound only for parameters fixed in advance,
so a block admits a run only if it plans the same event as every run already charged to it, and a
committed run is folded in as planned, whatever it executed: the runs on a block are then copies of one
mechanism whose number the lifetime caps before any of them runs, and what an early stop or a choice to
run again reveals is a function of those copies' outputs (post-processing).
"""
from __future__ import annotations

import datetime as dt
import math
import os
import uuid
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence

import dp_accounting
from sqlalchemy import (Column, DateTime, Float, ForeignKeyConstraint, Index, Integer, String, Text, UniqueConstraint,
                        create_engine, delete, event, func, insert, select, text)
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Session, deferred, undefer_group

from components.accountants import Accountant, describe_event, event_from_json, event_to_json
from components.accountants.composed import ComposedState, scaled_noise
from specs.sections import default_ledger

RESERVED, COMMITTED, ABORTED = "reserved", "committed", "aborted"
WHOLE = "all"  # the block of a dataset charged as one: every dataset before blocks, and any without them

# What a worker (a role that runs specs) may write, besides reading every table: table -> the columns it may
# update. Nothing may be deleted, a dataset's terms are the owner's (privzo_datasets is not here), and a
# block's terms are fixed by its foreign key; rows keep the block they were first seen in.
WORKER_GRANTS: Dict[str, tuple] = {
    "privzo_charges": ("status", "executed_event", "steps_run", "run_id", "updated_at"),
    "privzo_charge_blocks": (),
    "privzo_blocks": ("committed", "committed_epsilon"),
    "privzo_private_rows": (),
    "privzo_row_blocks": (),
    "privzo_row_layouts": (),
}


class BudgetExceeded(RuntimeError):
    """The run would take a block of the dataset past its lifetime epsilon; nothing was reserved.

    ``would_reach``: the block's composed epsilon with this run; ``fits``: the largest epsilon a run of the
    same shape (more noise, same steps and sampling) can have and still compose within the lifetime, None if
    none can; ``next_block``: the block whose arrival brings budget, None if no arrival can."""

    def __init__(self, dataset: str, remaining: float, requested: float, lifetime: float, *, block: str = WHOLE,
                 would_reach: Optional[float] = None, fits: Optional[float] = None, charges: int = 0,
                 next_block: Optional[str] = None, when: Optional[str] = None):
        self.dataset, self.remaining, self.requested, self.lifetime = dataset, remaining, requested, lifetime
        self.block, self.would_reach, self.fits, self.next_block = block, would_reach, fits, next_block
        where = f"dataset {dataset!r}" if block == WHOLE else f"block {block!r} of dataset {dataset!r}"
        reach = "" if would_reach is None else (
            f": composed with the {charges} charge{'s' if charges != 1 else ''} before it, it would reach "
            f"{would_reach:.4g} of the lifetime {lifetime:.4g}")
        fit = (f"a run of epsilon <= {fits:.4g} still fits (lower privacy.epsilon)" if fits is not None
               else "no run fits any more")
        if when is not None:
            pass
        elif next_block is not None:
            when = f"block {next_block!r} brings budget of its own when it arrives"
        elif block == WHOLE:
            when = ("new rows bring no budget to a dataset charged as one block (data.blocks with budget.window "
                    "gives each period's rows a budget of their own)")
        else:
            when = "no block that the window can still choose has budget left"
        super().__init__(f"budget.lifetime_epsilon: {where} cannot take this run of epsilon {requested:.4g}{reach}; "
                         f"{fit}; {when}")


@dataclass(frozen=True)
class BlockTerms:
    """A block a run reads: its id, and the lifetime it is registered with on first use. ``rows``: its
    declared size, a public fact (never a count of its rows)."""

    block: str
    lifetime_epsilon: float
    delta: float
    rows: Optional[int] = None


@dataclass(frozen=True)
class Block:
    """A block as ``blocks`` lists it: its terms, what its committed charges compose to, the epsilon with
    its open reservations, and how many charges it holds."""

    dataset: str
    block: str
    lifetime_epsilon: float
    delta: float
    rows: Optional[int]
    committed_epsilon: float
    epsilon: float
    charges: int
    created_at: dt.datetime


class RowsExposed(RuntimeError):
    """The run would use rows as public or test data that earlier runs on the dataset, or on ``other``
    dataset of the ledger, kept private."""

    def __init__(self, dataset: str, n_rows: int, other: Optional[str] = None):
        self.dataset, self.n_rows, self.other = dataset, n_rows, other
        if other is not None:
            super().__init__(
                f"data.split: {n_rows} public or test rows of this run are private rows of dataset {other!r} in "
                f"this ledger and cannot be used without noise under {dataset!r}; leave them out of this run's "
                "public and test rows (data.split), or train on them privately under their own budget.dataset "
                f"{other!r}")
            return
        super().__init__(
            f"data.split: {n_rows} public or test rows of this run were private in earlier runs on dataset "
            f"{dataset!r} and cannot be used without noise now; keep the seed and data.split of those runs "
            "(data that grows between runs needs data.split.kind hashed, column or source from its first run)")


class RowsUnmatched(RuntimeError):
    """The run identifies rows differently from earlier runs on the dataset, so they cannot be matched."""

    def __init__(self, dataset: str, recorded: str, now: str, reason: Optional[str] = None):
        self.dataset, self.recorded, self.now = dataset, recorded, now
        super().__init__(reason or (
            f"data.source: this run identifies rows differently from earlier runs on dataset {dataset!r} "
            f"({_layout_change(recorded, now)}), so the ledger cannot tell which rows they kept private; keep "
            "the source's columns and text settings of those runs, or charge a new dataset"))


class RowsLaundered(RowsUnmatched):
    """Rows this run would keep private are private rows of another dataset: the same people charged under a
    second name would have a second budget."""

    def __init__(self, dataset: str, other: str, n_rows: int, persons: bool = False):
        what = "persons of this run (data.blocks.person) are persons" if persons else \
            "private rows of this run are private rows"
        RuntimeError.__init__(
            self, f"budget.dataset: {n_rows} {what} of dataset {other!r} in this ledger; the same people cannot "
            f"have a second budget under {dataset!r}: charge them to {other!r}")
        self.dataset, self.recorded, self.now, self.other = dataset, "", "", other


class RowsUnrecognised(RowsUnmatched):
    """Same layout, but not one of the run's rows is a row earlier runs kept private: the rows were
    re-encoded (a label or a value written another way gives every row a new fingerprint) or replaced.
    Either way the ledger cannot tell which of them were private before, and a re-encoded private row
    could land in the public or test split unrecognised."""

    def __init__(self, dataset: str, n_known: int, block: Optional[str] = None):
        known = (f"the {n_known} rows earlier runs on dataset {dataset!r} kept private" if block is None else
                 f"the {n_known} rows earlier runs on dataset {dataset!r} recorded in it")
        RuntimeError.__init__(
            self, f"data.source: none of this run's rows{'' if block is None else f' in block {block!r}'} matches "
            f"{known}; if they are the same people's rows, write them as those runs read them "
            "(labels, values and columns unchanged) and under the same PRIVZO_FINGERPRINT_KEY; if they are new "
            "people, charge a new budget.dataset")
        self.dataset, self.recorded, self.now, self.block = dataset, "", "", block


class LedgerUnavailable(RuntimeError):
    """The ledger cannot be signed into or written with the caller's credentials: a run that would spend a
    dataset's budget is refused before any row is read, with nothing charged."""

    def __init__(self, where: str, reason: str):
        super().__init__(f"budget.ledger: cannot spend budget through {where} ({reason}); a run that spends a "
                         "dataset's budget needs the ledger's own credentials (budget.ledger, or "
                         "$PRIVZO_LEDGER_URL); nothing was read or charged")


class DatasetNotRegistered(LedgerUnavailable):
    """A run would charge a dataset the ledger has not registered, and its role may not register one: a
    dataset's lifetime is set by the ledger's owner, never by whoever runs a spec."""

    def __init__(self, dataset: str, where: str, what: str = "is not registered"):
        RuntimeError.__init__(
            self, f"budget.dataset: {dataset!r} {what} in the ledger {where}, and this role may not "
            "register it (a dataset's terms are set by the ledger's owner: privzo budget init "
            f"{dataset} --spec SPEC --ledger OWNER_URL); nothing was read or charged")


# the end of every refusal for terms other than the registered ones
FIXED = "a dataset's terms are fixed when it is registered: keep them, or charge a new budget.dataset"
NO_BLOCKS = "none"  # DatasetRow.blocks of a dataset registered without blocks (NULL: registered before terms)


@dataclass(frozen=True)
class DatasetTerms:
    """What a dataset is registered with: its lifetime (epsilon, delta), the accountant that composes its
    charges and the neighbouring relation they are accounted under, and its blocks: ``period`` (day, week or
    month; None: no blocks, one lifetime for all its rows), ``person`` (the person column: person level;
    None: event level) and ``declared`` (the persons, or rows at event level, declared per block). Changing
    any of them would let the same rows be charged against a lifetime of their own, so none may change."""

    dataset: str
    lifetime_epsilon: float
    delta: Optional[float]  # None: delta auto with no declared N, known once the private rows are counted
    accountant: str
    neighboring: str
    period: Optional[str] = None
    person: Optional[str] = None
    declared: Optional[int] = None

    @classmethod
    def of(cls, spec) -> "DatasetTerms":
        """The terms a run spec with a budget charges its dataset under."""
        try:  # delta auto is 1/N where N is declared (a public fact); otherwise it waits for the rows
            delta: Optional[float] = spec.delta_for()
        except ValueError:
            delta = None if spec.privacy.delta == "auto" else float(spec.privacy.delta)
        blocks = spec.data.blocks
        return cls(spec.budget.dataset, float(spec.budget.lifetime_epsilon), delta, spec.privacy.accountant,
                   spec.privacy.neighboring, blocks.period if blocks else None, blocks.person if blocks else None,
                   blocks.declared_units if blocks else None)

    def described(self) -> str:
        """The block terms in words, as ``budget init`` prints them."""
        if self.period is None:
            return "no blocks"
        unit = "persons" if self.person else "rows"
        level = f"person level (column {self.person!r})" if self.person else "event level"
        return f"blocks of a {self.period}, {level}, {self.declared} {unit} declared a block"


def _terms_problem(ds: "DatasetRow", terms: DatasetTerms) -> Optional[str]:
    """The first block term of ``terms`` that is not what ``ds`` is registered with, as a refusal's line;
    None if all are (lifetime, accountant and neighbouring are ``PrivacyLedger._check_terms``'s)."""
    return _blocks_problem(ds.dataset, ds.blocks, ds.person, ds.declared, terms.period, terms.person,
                           terms.declared)


def _blocks_problem(name: str, blocks: Optional[str], person: Optional[str], declared: Optional[int],
                    period: Optional[str], now_person: Optional[str], now_declared: Optional[int]) -> Optional[str]:
    """``blocks``/``person``/``declared``: the registered block terms; the others the run's."""
    if blocks == NO_BLOCKS and period is not None:
        return (f"data.blocks: dataset {name!r} is registered without blocks (one lifetime for all its rows), the "
                f"spec has data.blocks; {FIXED}")
    if blocks != NO_BLOCKS and period is None:
        return (f"data.blocks: dataset {name!r} is registered with blocks of a {blocks} (each with a lifetime of "
                f"its own), the spec has none; {FIXED}")
    if period is None:
        return None
    if blocks != period:
        return (f"data.blocks.period: dataset {name!r} is registered with blocks of a {blocks}, the spec says "
                f"{period}; {FIXED}")
    if person != now_person:
        registered = f"person level (column {person!r})" if person else "event level (no person column)"
        spec = f"says {now_person!r}" if now_person and person else f"has {now_person!r}" if now_person else "has none"
        return f"data.blocks.person: dataset {name!r} is registered {registered}, the spec {spec}; {FIXED}"
    if declared is not None and declared != now_declared:
        field, unit = ("declared_persons", "persons") if person else ("declared_private_rows", "rows")
        return (f"data.blocks.{field}: dataset {name!r} is registered with {declared} {unit} a block, the spec "
                f"says {now_declared}; {FIXED}")
    return None


def shown_url(url: Optional[str]) -> str:
    """A database URL as it may be shown: its password as ***, since a team ledger's URL holds one."""
    if not url:
        return "(none)"
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - only for display
        return url


def driver_reason(err: BaseException) -> str:
    """The database driver's own last line of an error (not SQLAlchemy's page of context)."""
    reason = str(getattr(err, "orig", None) or err).strip().splitlines()
    return reason[-1] if reason else type(err).__name__


def ledger_for_spending(url: str, terms: Optional[DatasetTerms] = None) -> "PrivacyLedger":
    """The ledger at ``url``, once it has signed the caller in and granted what a charge writes, and, given
    ``terms``, once the dataset is registered with them (or this role may register it); raises
    ``LedgerUnavailable`` (``DatasetNotRegistered``) or ValueError (other terms) in one line otherwise: a
    wrong password, a read-only role or file, a worker's run on a dataset nobody registered."""
    from sqlalchemy.exc import SQLAlchemyError

    where = shown_url(url)
    try:
        ledger = PrivacyLedger(url)
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


def _layout_change(recorded: str, now: str) -> str:
    """The first difference between two row layouts ('source:key=value;...'), in words."""
    def parts(layout: str) -> dict:
        head, _, rest = layout.partition(":")
        return {"source": head, **dict(p.partition("=")[::2] for p in rest.split(";") if p)}

    a, b = parts(recorded), parts(now)
    for key in list(a) + [k for k in b if k not in a]:
        if a.get(key) == b.get(key):
            continue
        old, new = (a.get(key) or "").split(","), (b.get(key) or "").split(",")
        if key == "features" and a.get(key) and b.get(key):
            added, removed = [c for c in new if c not in old], [c for c in old if c not in new]
            return f"feature {added[0]!r} added" if added else f"feature {removed[0]!r} removed"
        return f"{key} {a.get(key, 'unset')!r} before, {b.get(key, 'unset')!r} now"
    return "layout changed"


class _Base(DeclarativeBase):
    pass


class DatasetRow(_Base):
    __tablename__ = "privzo_datasets"
    # what a block's foreign key names: a block's terms can only be its dataset's
    __table_args__ = (UniqueConstraint("dataset", "lifetime_epsilon", "delta", name="privzo_datasets_terms"),)
    dataset = Column(String(200), primary_key=True)
    lifetime_epsilon = Column(Float, nullable=False)
    delta = Column(Float, nullable=False)
    accountant = Column(String(20), nullable=False)
    neighboring = Column(String(20), nullable=False)
    # the block terms (DatasetTerms): added to ledgers made before them by _migrate, so nullable, and
    # deferred: a role that reads a PostgreSQL ledger its owner has not migrated yet still reads the rest.
    # blocks: the period, or NO_BLOCKS; NULL for a dataset registered before they were kept
    blocks = deferred(Column(String(8), nullable=True), group="terms")
    person = deferred(Column(String(200), nullable=True), group="terms")  # the person column, NULL: event level
    declared = deferred(Column(Integer, nullable=True), group="terms")  # persons (rows) declared per block


TERM_COLUMNS = ("blocks", "person", "declared")


class PrivateRowRow(_Base):
    """A row (content fingerprint) some run on the dataset reserved as private."""

    __tablename__ = "privzo_private_rows"
    # exposure and laundering look a row up in every dataset
    __table_args__ = (Index("privzo_private_rows_row", "row"),)
    dataset = Column(String(200), primary_key=True)
    row = Column(String(64), primary_key=True)


class RowLayoutRow(_Base):
    """What the dataset's row fingerprints are computed from (Table.layout), fixed by its first run."""

    __tablename__ = "privzo_row_layouts"
    dataset = Column(String(200), primary_key=True)
    layout = Column(Text, nullable=False)


class BlockRow(_Base):
    """A block of a dataset: its lifetime, and the exact composition of its committed charges (a
    ``ComposedState``), updated by every commit so a reservation need not recompose the history."""

    __tablename__ = "privzo_blocks"
    # a worker may add blocks but not choose their lifetime: it is the dataset's, which only the owner writes
    __table_args__ = (ForeignKeyConstraint(
        ["dataset", "lifetime_epsilon", "delta"],
        ["privzo_datasets.dataset", "privzo_datasets.lifetime_epsilon", "privzo_datasets.delta"],
        name="privzo_blocks_terms"),)
    dataset = Column(String(200), primary_key=True)
    block = Column(String(200), primary_key=True)
    lifetime_epsilon = Column(Float, nullable=False)
    delta = Column(Float, nullable=False)
    rows = Column(Integer, nullable=True)
    committed = deferred(Column(Text, nullable=False))  # read only when composed onto (a PLD state is megabytes)
    committed_epsilon = Column(Float, nullable=False)  # the committed composition's at the block's delta
    created_at = Column(DateTime, nullable=False)


class ChargeBlockRow(_Base):
    """A charge on one block it read."""

    __tablename__ = "privzo_charge_blocks"
    charge_id = Column(String(36), primary_key=True)
    block = Column(String(200), primary_key=True)
    dataset = Column(String(200), nullable=False, index=True)


class RowBlockRow(_Base):
    """The block a row (keyed fingerprint) was in when a run first saw it; with persons, the block a person
    (keyed) first arrived in. Later runs read it, so a row written again with a new date keeps its block."""

    __tablename__ = "privzo_row_blocks"
    # laundering looks a person up in every dataset
    __table_args__ = (Index("privzo_row_blocks_key", "kind", "key"),)
    dataset = Column(String(200), primary_key=True)
    kind = Column(String(8), primary_key=True)  # row | person
    key = Column(String(64), primary_key=True)
    block = Column(String(200), nullable=False)


class ChargeRow(_Base):
    __tablename__ = "privzo_charges"
    id = Column(String(36), primary_key=True)
    dataset = Column(String(200), nullable=False, index=True)
    fingerprint = Column(String(64), nullable=False)
    run_name = Column(String(200), nullable=False)
    run_id = Column(String(64), nullable=True)
    status = Column(String(12), nullable=False)
    planned_event = Column(Text, nullable=False)
    executed_event = Column(Text, nullable=True)
    steps_planned = Column(Integer, nullable=False)
    steps_run = Column(Integer, nullable=False, default=0)
    planned_epsilon = Column(Float, nullable=False)
    created_at = Column(DateTime, nullable=False)
    updated_at = Column(DateTime, nullable=False)


@dataclass(frozen=True)
class Charge:
    id: str
    dataset: str
    fingerprint: str
    run_name: str
    run_id: Optional[str]
    status: str
    steps_planned: int
    steps_run: int
    planned_epsilon: float
    event: dp_accounting.DpEvent  # executed if committed, planned otherwise
    created_at: dt.datetime


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


class PrivacyLedger:
    def __init__(self, url: str):
        self.url = url
        if url == default_ledger():  # this user's ledger: its folder is made on first use
            os.makedirs(os.path.dirname(url.split(":///", 1)[1]), mode=0o700, exist_ok=True)
        self.engine: Engine = create_engine(url, future=True, **self._engine_options(url))
        if self.engine.dialect.name == "sqlite":
            @event.listens_for(self.engine, "connect")
            def _sqlite(dbapi_connection, _record):  # noqa: ANN001 - DB-API connection
                dbapi_connection.isolation_level = None  # we issue BEGIN IMMEDIATE ourselves
                dbapi_connection.execute("PRAGMA busy_timeout = 60000")
                dbapi_connection.execute("PRAGMA foreign_keys = ON")  # a block's terms are its dataset's

            @event.listens_for(self.engine, "begin")
            def _begin(conn):  # noqa: ANN001
                conn.exec_driver_sql("BEGIN IMMEDIATE")  # take the write lock before reading the total
            _Base.metadata.create_all(self.engine)
            with self.engine.begin() as conn:
                self.terms_kept = self._migrate(conn)
        elif self.engine.dialect.name == "postgresql":
            # first use by several runs at once: one creates the tables, the others then find them
            with self.engine.begin() as conn:
                conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('privzo ledger schema'))"))
                _Base.metadata.create_all(conn)
                self.terms_kept = self._migrate(conn)
        else:
            _Base.metadata.create_all(self.engine)
            with self.engine.begin() as conn:
                self.terms_kept = self._migrate(conn)

    def _migrate(self, conn) -> bool:  # noqa: ANN001 - a SQLAlchemy connection in a transaction
        """Bring a ledger an earlier privzo made up to these tables (the datasets' block terms, the indexes the
        checks across datasets use); whether the terms columns are there. A SQLite file is migrated by
        whoever may write it; a PostgreSQL ledger only by its tables' owner, as ``grant`` migrates it, so a
        worker's or viewer's open leaves it as it is (they then read it, and a worker's run is refused
        until the owner has opened it once)."""
        have = {c["name"] for c in sa_inspect(conn).get_columns(DatasetRow.__tablename__)}
        missing = [c for c in TERM_COLUMNS if c not in have]
        if self.engine.dialect.name == "sqlite":
            path = self.engine.url.database
            if path and not os.access(path, os.W_OK):
                return not missing
        elif self.engine.dialect.name == "postgresql":
            owner = conn.execute(text("SELECT pg_has_role(current_user, tableowner, 'USAGE') FROM pg_tables "
                                      "WHERE schemaname = current_schema() AND tablename = :t"),
                                 {"t": DatasetRow.__tablename__}).scalar()
            if not owner:
                return not missing
        for name in missing:  # nullable: the datasets already registered keep NULL until they adopt terms
            kind = DatasetRow.__table__.c[name].type.compile(conn.dialect)
            conn.execute(text(f"ALTER TABLE {DatasetRow.__tablename__} ADD COLUMN {name} {kind}"))
        for table in (PrivateRowRow.__table__, RowBlockRow.__table__):
            for index in table.indexes:
                index.create(conn, checkfirst=True)
        return True

    def missing_write_grants(self) -> List[str]:
        """What of the ledger this connection may not write as a charge does (``WORKER_GRANTS``), as
        "TABLE" or "COLUMN of TABLE": none for its owner or a worker; a read-only role (a viewer's) misses
        them all. A SQLite file must be writable."""
        if self.engine.dialect.name == "sqlite":
            path = self.engine.url.database
            return [] if not path or os.access(path, os.W_OK) else sorted(WORKER_GRANTS)
        if self.engine.dialect.name != "postgresql":
            return []
        missing = []
        with self.engine.connect() as conn:
            for table, columns in sorted(WORKER_GRANTS.items()):
                if not conn.execute(text("SELECT has_table_privilege(current_user, :t, 'INSERT')"), {"t": table}).scalar():
                    missing.append(table)
                    continue
                missing += [f"{c} of {table}" for c in columns if not conn.execute(
                    text("SELECT has_column_privilege(current_user, :t, :c, 'UPDATE')"), {"t": table, "c": c}).scalar()]
        return missing

    def may_register(self) -> bool:
        """Whether this connection may register datasets (the owner's act): a SQLite file's writer always."""
        if self.engine.dialect.name != "postgresql":
            return True
        with self.engine.connect() as conn:
            return bool(conn.execute(text("SELECT has_table_privilege(current_user, :t, 'INSERT')"),
                                     {"t": DatasetRow.__tablename__}).scalar())

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
            self._check_terms(ds, terms.lifetime_epsilon, terms.accountant, terms.neighboring)
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
                        "registered lifetime is never changed (register the people under a new dataset name)")
                unset = ds.blocks is None
                self._settle_terms(session, ds, terms, terms.period is not None, adopt=True)
                return unset
            Accountant(terms.accountant, terms.neighboring)  # an unknown accountant fails here, not in a run
            session.add(DatasetRow(dataset=terms.dataset, lifetime_epsilon=terms.lifetime_epsilon, delta=terms.delta,
                                   accountant=terms.accountant, neighboring=terms.neighboring,
                                   **self._term_values(terms)))
            return True

    @staticmethod
    def _term_values(terms: Optional[DatasetTerms]) -> dict:
        """The block terms' columns of a dataset registered with ``terms``; None: left unset (NULL), for its
        next run that gives terms to fix (a caller of ``reserve`` that gives none)."""
        if terms is None:
            return {}
        return {"blocks": terms.period or NO_BLOCKS, "person": terms.person if terms.period else None,
                "declared": terms.declared if terms.period else None}

    def _terms_columns_kept(self) -> None:
        if not self.terms_kept:
            raise LedgerUnavailable(shown_url(self.url), "its tables predate the dataset terms it keeps; its owner "
                                    "adds them by opening it once, e.g. privzo budget grant ROLE --ledger OWNER_URL")

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
                problem = _terms_problem(ds, terms)
            else:
                problem = _blocks_problem(name, ds.blocks, ds.person, ds.declared,
                                          (ds.blocks if ds.blocks != NO_BLOCKS else "?") if has_blocks else None,
                                          ds.person, ds.declared)
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
            for column, value in self._term_values(terms).items():
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
        """Give ``role`` (an existing PostgreSQL role) what a worker needs (``WORKER_GRANTS``: read
        everything, charge registered datasets) or, ``read_only``, what a viewer needs (read everything);
        the statements run, in order. Only the tables' owner may grant; nothing else is given (no delete, no
        dataset registration, no lifetime)."""
        import re

        if self.engine.dialect.name != "postgresql":
            raise ValueError(f"budget grant: a {self.engine.dialect.name} ledger has no roles (whoever may write "
                             "its file may spend it); roles need a PostgreSQL ledger")
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", role):
            raise ValueError(f"budget grant: {role!r} is not a role name (lower-case letters, digits and _, "
                             "starting with a letter or _)")
        statements = ["GRANT USAGE ON SCHEMA {schema} TO {role}"]
        statements += [f"GRANT SELECT ON {t} TO {{role}}" for t in sorted(_Base.metadata.tables)]
        if not read_only:
            for table, columns in sorted(WORKER_GRANTS.items()):
                statements.append(f"GRANT INSERT ON {table} TO {{role}}")
                if columns:
                    statements.append(f"GRANT UPDATE ({', '.join(columns)}) ON {table} TO {{role}}")
        with self.engine.begin() as conn:
            exists = conn.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).scalar()
            if not exists:
                raise ValueError(f"budget grant: there is no role {role!r} on this server; its administrator "
                                 f"creates it first (CREATE ROLE {role} LOGIN PASSWORD '...')")
            schema = conn.execute(text("SELECT current_schema()")).scalar()
            # PostgreSQL only warns when a role without the grant option grants: check ownership first
            owner = conn.execute(text("SELECT pg_has_role(current_user, tableowner, 'USAGE') FROM pg_tables "
                                      "WHERE schemaname = current_schema() AND tablename = :t"),
                                 {"t": DatasetRow.__tablename__}).scalar()
            if not owner:
                raise ValueError("budget grant: only the ledger's owner (the role that owns its tables) grants; "
                                 "connect with the owner's credentials")
            fks = {fk["name"] for fk in sa_inspect(conn).get_foreign_keys(BlockRow.__tablename__)}
            if "privzo_blocks_terms" not in fks:  # a ledger made before blocks were tied to their dataset's terms
                statements[:0] = [
                    "ALTER TABLE privzo_datasets ADD CONSTRAINT privzo_datasets_terms UNIQUE (dataset, lifetime_epsilon, delta)",
                    "ALTER TABLE privzo_blocks ADD CONSTRAINT privzo_blocks_terms FOREIGN KEY (dataset, lifetime_epsilon, "
                    "delta) REFERENCES privzo_datasets (dataset, lifetime_epsilon, delta)"]
            done = [s.format(schema=schema, role=role) for s in statements]
            for statement in done:
                conn.execute(text(statement))
        return done

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
                              min((r.created_at for r in charges), default=_now()))]
            out = []
            for b in rows:
                linked = self._linked(session, b)
                out.append(Block(dataset, b.block, b.lifetime_epsilon, b.delta, b.rows,
                                 b.committed_epsilon, self._block_epsilon(session, b),
                                 sum(1 for r in linked if r.status != ABORTED), b.created_at))
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
                return self._largest_fit(base, planned, ds.lifetime_epsilon, ds.delta, 20)
            fits = [self._largest_fit(self._with_open(session, b), planned, b.lifetime_epsilon, b.delta, 20)
                    for b in rows]
            return None if any(f is None for f in fits) else min(fits)

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

    @staticmethod
    def _largest_fit(base: ComposedState, planned: dp_accounting.DpEvent, lifetime: float, delta: float,
                     probes: int) -> Optional[float]:
        """The largest epsilon (at ``delta``, floored to 4 significant digits) of ``planned`` with its noise
        scaled up that still composes onto ``base`` within ``lifetime``; None if none does."""
        def fits(factor: float) -> bool:
            return base.composed([scaled_noise(planned, factor)]).epsilon(delta) <= lifetime

        low, high = 1.0, 1e4
        if not fits(high):
            return None
        for _ in range(probes):  # bisection in log scale: ``high`` always fits
            middle = math.sqrt(low * high)
            low, high = (low, middle) if fits(middle) else (middle, high)
        alone = ComposedState(base.accountant).composed([scaled_noise(planned, high)]).epsilon(delta)
        digits = 3 - math.floor(math.log10(alone)) if alone > 0 else 0
        return math.floor(alone * 10 ** digits) / 10 ** digits

    def dataset(self, dataset: str) -> Optional[DatasetRow]:
        with Session(self.engine) as session:
            row = session.get(DatasetRow, dataset, options=[undefer_group("terms")] if self.terms_kept else [])
            if row is not None:
                session.expunge(row)
            return row

    def history(self, dataset: str) -> List[Charge]:
        with Session(self.engine) as session, session.begin():
            return [Charge(r.id, r.dataset, r.fingerprint, r.run_name, r.run_id, r.status, r.steps_planned,
                           r.steps_run, r.planned_epsilon,
                           event_from_json(r.executed_event if r.status == COMMITTED else r.planned_event),
                           r.created_at)
                    for r in self._charges(session, dataset)]

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
    def reserve(self, *, dataset: str, fingerprint: str, run_name: str, planned: dp_accounting.DpEvent,
                steps: int, lifetime_epsilon: float, delta: float, accountant: str, neighboring: str,
                private_rows: Iterable[str] = (), exposed_rows: Iterable[str] = (), row_layout: str = "",
                legacy_layout: Optional[str] = None, legacy_rows: Optional[Mapping[str, str]] = None,
                charge_id: Optional[str] = None, blocks: Optional[Sequence[BlockTerms]] = None,
                next_block: Optional[str] = None, row_blocks: Optional[Mapping[str, str]] = None,
                person_blocks: Optional[Mapping[str, str]] = None,
                when: Optional[Callable[[List[str]], str]] = None, terms: Optional[DatasetTerms] = None) -> str:
        """Reserve ``planned`` on ``dataset`` if the composed total stays within ``lifetime_epsilon`` and no
        row in ``exposed_rows`` (this run's public and test rows) was private in an earlier run on any dataset
        of the ledger; records ``private_rows``, refusing any that another dataset holds private (and, with
        ``person_blocks``, any person another dataset recorded). Rows are matched by fingerprint, so
        ``row_layout`` (what fingerprints are computed from) must be the dataset's. Returns the charge id, or
        raises ``BudgetExceeded`` / ``RowsExposed`` / ``RowsUnmatched`` / ValueError (terms) having written
        nothing. Rows of a reservation later aborted stay recorded.

        ``terms``: the dataset's terms as the run's spec gives them (``DatasetTerms.of``), registered with a
        new dataset and checked against a registered one's in this transaction; None (a direct caller):
        only whether the run reads blocks is checked, and a new dataset's block terms stay unset.

        A dataset whose rows were recorded under ``legacy_layout`` (plain hashes, before rows were keyed) is
        re-keyed in the same transaction with ``legacy_rows`` (each of this run's rows: plain -> keyed),
        provided every recorded row is among them; otherwise the run is refused and nothing changes.
        ``charge_id``: chosen by the caller, who records it before reserving (see flows.checkpoints).

        ``blocks``: the blocks the run reads (its window), each registered with its dataset's terms on first use; the
        run is reserved on every one of them or on none. None: the dataset's one block. ``next_block``: for
        a refusal's message, the block whose arrival brings budget, or ``when``: what to say given every
        block of the window without room (the window's own rule knows when it moves past them).
        ``row_blocks`` / ``person_blocks``: the block of every row (person) the run saw, recorded where none
        is yet; one recorded otherwise since the run read the ledger (a concurrent run saw the row first)
        refuses the run."""
        from sqlalchemy.exc import DBAPIError

        try:
            return self._reserve(dataset=dataset, fingerprint=fingerprint, run_name=run_name, planned=planned,
                                 steps=steps, lifetime_epsilon=lifetime_epsilon, delta=delta, accountant=accountant,
                                 neighboring=neighboring, private_rows=private_rows, exposed_rows=exposed_rows,
                                 row_layout=row_layout, legacy_layout=legacy_layout, legacy_rows=legacy_rows,
                                 charge_id=charge_id, blocks=blocks, next_block=next_block, row_blocks=row_blocks,
                                 person_blocks=person_blocks, when=when, terms=terms)
        except DBAPIError as err:
            # a role refused a write mid-reservation (a worker re-keying a dataset's rows: the owner's act);
            # the transaction rolled back, so nothing was written
            if "permission denied" not in driver_reason(err) and "violates foreign key" not in driver_reason(err):
                raise
            raise LedgerUnavailable(shown_url(self.url), driver_reason(err)) from None

    def _reserve(self, *, dataset, fingerprint, run_name, planned, steps, lifetime_epsilon, delta, accountant,
                 neighboring, private_rows, exposed_rows, row_layout, legacy_layout, legacy_rows, charge_id, blocks,
                 next_block, row_blocks, person_blocks, when, terms) -> str:
        self._terms_columns_kept()
        with Session(self.engine) as session, session.begin():
            ds = self._lock(session, dataset)
            if ds is None:
                if not self.may_register():
                    raise DatasetNotRegistered(dataset, shown_url(self.url))
                ds = DatasetRow(dataset=dataset, lifetime_epsilon=lifetime_epsilon, delta=delta,
                                accountant=accountant, neighboring=neighboring, **self._term_values(terms))
                session.add(ds)
                session.flush()
            else:
                self._check_terms(ds, lifetime_epsilon, accountant, neighboring)
            self._settle_terms(session, ds, terms, blocks is not None, adopt=True)
            if not Accountant(ds.accountant, ds.neighboring).supports(planned):
                raise ValueError(
                    f"privacy.accountant: dataset {dataset!r} is accounted with {ds.accountant} (set by its first "
                    f"run), which has no accounting for this run's {describe_event(planned)}; use a sampling it "
                    "accounts for, or a new budget.dataset")
            self._blocks_written(session, ds)
            rows, requested = self._admit(session, ds, planned, blocks, next_block, when)
            recorded = session.get(RowLayoutRow, dataset)
            if recorded is None:
                session.add(RowLayoutRow(dataset=dataset, layout=row_layout))
            elif recorded.layout != row_layout and legacy_layout is not None and recorded.layout == legacy_layout:
                self._rekey(session, dataset, legacy_rows or {})
                recorded.layout = row_layout
            elif recorded.layout != row_layout:
                raise RowsUnmatched(dataset, recorded.layout, row_layout)
            known = set(session.scalars(select(PrivateRowRow.row).where(PrivateRowRow.dataset == dataset)))
            exposed_rows, private_rows = set(exposed_rows), set(private_rows)
            recorded = {kind: dict(session.execute(select(RowBlockRow.key, RowBlockRow.block).where(
                RowBlockRow.dataset == dataset, RowBlockRow.kind == kind)).all()) for kind in ("row", "person")}
            if blocks is None:  # one lifetime for all its rows: a run that matches none of them is suspect
                if known and (private_rows or exposed_rows) and not known & (private_rows | exposed_rows):
                    raise RowsUnrecognised(dataset, len(known))
            else:  # a window of new blocks shares no row with earlier ones, and need not
                self._refuse_unrecognised_blocks(dataset, row_blocks or {}, person_blocks or {}, recorded)
            exposed = known.intersection(exposed_rows)
            if exposed:
                raise RowsExposed(dataset, len(exposed))
            new_rows = set(private_rows) - known
            new_persons = sorted(set(person_blocks or {}) - set(recorded["person"]))
            if exposed_rows or new_rows or new_persons:
                # what other datasets hold is read and claimed as one act: no other dataset's first run may
                # record the same rows or persons between this check and this transaction's commit
                self._lock_rows(session)
                self._refuse_exposed_elsewhere(session, dataset, exposed_rows - known)
                self._refuse_laundering(session, dataset, new_rows)
                self._refuse_laundered_persons(session, dataset, new_persons)
            if new_rows:
                session.execute(insert(PrivateRowRow), [{"dataset": dataset, "row": r} for r in sorted(new_rows)])
            for kind, seen in (("row", row_blocks), ("person", person_blocks)):
                if seen:
                    self._record_blocks(session, dataset, kind, seen, recorded[kind])
            charge = ChargeRow(id=charge_id or str(uuid.uuid4()), dataset=dataset, fingerprint=fingerprint, run_name=run_name,
                               status=RESERVED, planned_event=event_to_json(planned), steps_planned=steps,
                               steps_run=0, planned_epsilon=requested, created_at=_now(), updated_at=_now())
            session.add(charge)
            session.flush()
            session.execute(insert(ChargeBlockRow), [{"charge_id": charge.id, "block": r.block, "dataset": dataset}
                                                     for r in rows])
            return charge.id

    def _admit(self, session: Session, ds: DatasetRow, planned: dp_accounting.DpEvent,
               blocks: Optional[Sequence[BlockTerms]], next_block: Optional[str] = None,
               when: Optional[Callable[[List[str]], str]] = None):
        """The window's block rows (new ones added to ``session``) and the planned run's epsilon, if every block
        can take ``planned``; raises ``BudgetExceeded`` (or ValueError) otherwise."""
        dataset = ds.dataset
        accountant = Accountant(ds.accountant, ds.neighboring)
        increment = ComposedState(accountant).composed([planned])  # planned once, added to every block
        requested = increment.epsilon(ds.delta)
        window = list(blocks) if blocks is not None else [BlockTerms(WHOLE, ds.lifetime_epsilon, ds.delta)]
        rows, over = [], []
        for terms in window:
            if ds.accountant == "pld":
                self._refuse_another_event(session, dataset, terms.block, planned)
            row = session.get(BlockRow, (dataset, terms.block))
            registered = row if row is not None else ds  # a new block takes its dataset's terms
            if not (math.isclose(registered.lifetime_epsilon, terms.lifetime_epsilon) and registered.delta == terms.delta):
                raise ValueError(f"budget: block {terms.block!r} of dataset {dataset!r} is registered with "
                                 f"lifetime epsilon {registered.lifetime_epsilon:g} at delta {registered.delta:g}, "
                                 f"the spec says {terms.lifetime_epsilon:g} at {terms.delta:g}; they must match")
            if row is None:
                row = BlockRow(dataset=dataset, block=terms.block, lifetime_epsilon=ds.lifetime_epsilon,
                               delta=ds.delta, rows=terms.rows, committed=ComposedState(accountant).to_json(),
                               committed_epsilon=0.0, created_at=_now())
                session.add(row)
            base = self._with_open(session, row)
            after = base.plus(increment).epsilon(row.delta)
            if not after <= row.lifetime_epsilon:  # fails closed on nan / inf
                over.append((terms.block, base, after, row))
            rows.append(row)
        if over:  # named by its oldest full block; ``when`` sees every full one
            block, base, after, row = over[0]
            probes = 10 if ds.accountant == "pld" else 20  # a PLD composition costs ~1000x an RDP one
            raise BudgetExceeded(
                dataset, row.lifetime_epsilon - base.epsilon(row.delta), requested, row.lifetime_epsilon,
                block=block, would_reach=after, charges=base.count,
                fits=self._largest_fit(base, planned, row.lifetime_epsilon, row.delta, probes),
                next_block=next_block, when=when([b for b, *_ in over]) if when is not None else None)
        return rows, requested

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
                except (BudgetExceeded, ValueError):
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
                finally:
                    session.rollback()

    @staticmethod
    def _refuse_another_event(session: Session, dataset: str, block: str, planned: dp_accounting.DpEvent) -> None:
        """Under pld, a block takes copies of one planned event only (see the module's note on filters)."""
        others = session.scalars(
            select(ChargeRow.id).join(ChargeBlockRow, ChargeBlockRow.charge_id == ChargeRow.id)
            .where(ChargeBlockRow.dataset == dataset, ChargeBlockRow.block == block, ChargeRow.status != ABORTED,
                   ChargeRow.planned_event != event_to_json(planned))).all()
        if others:
            where = f"dataset {dataset!r}" if block == WHOLE else f"block {block!r} of dataset {dataset!r}"
            raise ValueError(
                f"privacy.accountant: {where} is accounted with pld, exact only for runs whose parameters were "
                f"fixed in advance, and this run plans another event than {len(others)} run"
                f"{'s' if len(others) != 1 else ''} charged to it (its noise, steps or sampling differ); keep "
                "them as they were, or account a new budget.dataset with rdp or zcdp, whose admission is a "
                "privacy filter for parameters chosen as runs go")

    def _lock_rows(self, session: Session) -> None:
        """PostgreSQL: the ledger-wide lock a reservation takes (after its dataset's) before it reads other
        datasets' rows and persons and records its own (SQLite's BEGIN IMMEDIATE already locks the file).
        Taken second, and only here, so it waits on no other lock: no deadlock, and a reservation's budget
        arithmetic is not serialised with other datasets'."""
        if self.engine.dialect.name == "postgresql":  # the two-key space: apart from the datasets' locks
            session.execute(text("SELECT pg_advisory_xact_lock(hashtext('privzo'), hashtext('rows of every "
                                 "dataset'))"))

    @staticmethod
    def _held_elsewhere(session: Session, dataset: str, keys: Iterable[str], column, where) -> Optional[tuple]:
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

    @classmethod
    def _refuse_exposed_elsewhere(cls, session: Session, dataset: str, rows: set) -> None:
        """Refuse public or test rows that another dataset of the ledger keeps private: used without noise
        under one name, they would expose people whose privacy another name's runs spent."""
        found = cls._held_elsewhere(session, dataset, rows, PrivateRowRow.row, ())
        if found is not None:
            raise RowsExposed(dataset, found[1], other=found[0])

    @classmethod
    def _refuse_laundering(cls, session: Session, dataset: str, rows: set) -> None:
        """Refuse rows already private under another dataset name (keyed fingerprints share one key)."""
        found = cls._held_elsewhere(session, dataset, rows, PrivateRowRow.row, ())
        if found is not None:
            raise RowsLaundered(dataset, found[0], found[1])

    @classmethod
    def _refuse_laundered_persons(cls, session: Session, dataset: str, persons: Sequence[str]) -> None:
        """Refuse persons (keyed ids of data.blocks.person) another dataset of the ledger recorded: matched on
        who they are, not on their rows' content, so rows written another way do not make them new people."""
        found = cls._held_elsewhere(session, dataset, persons, RowBlockRow.key, (RowBlockRow.kind == "person",))
        if found is not None:
            raise RowsLaundered(dataset, found[0], found[1], persons=True)

    @staticmethod
    def _refuse_unrecognised_blocks(dataset: str, row_blocks: Mapping[str, str], person_blocks: Mapping[str, str],
                                    recorded: Mapping[str, Mapping[str, str]]) -> None:
        """On blocks: refuse a run with rows in a block where earlier runs recorded rows, none of which (nor
        of whose persons) it recognises: those rows were re-encoded or replaced, and a re-encoded private row
        could land in the public or test split unrecognised. A block nobody recorded yet (a new window, a
        window after a gap) has nothing to recognise, so it passes."""
        rows, persons = recorded["row"], recorded["person"]
        held = set(rows.values()) | set(persons.values())
        known = {b for k, b in row_blocks.items() if rows.get(k) == b}
        known |= {b for k, b in person_blocks.items() if persons.get(k) == b}  # a person's new row is theirs
        for block in sorted(set(row_blocks.values())):
            if block in held and block not in known:
                raise RowsUnrecognised(dataset, sum(1 for b in rows.values() if b == block), block=block)

    @staticmethod
    def _record_blocks(session: Session, dataset: str, kind: str, seen: Mapping[str, str],
                       recorded: Mapping[str, str]) -> None:
        moved = [k for k, b in seen.items() if k in recorded and recorded[k] != b]
        if moved:
            raise RowsUnmatched(dataset, "", "", reason=(
                f"data.blocks: {len(moved)} {kind}s of this run were recorded in other blocks by a run that saw them "
                f"first while this one was loading; run again, so that it reads them in their recorded blocks"))
        new = sorted(k for k in seen if k not in recorded)
        if new:
            session.execute(insert(RowBlockRow), [{"dataset": dataset, "kind": kind, "key": k, "block": seen[k]}
                                                  for k in new])

    @staticmethod
    def _rekey(session: Session, dataset: str, keyed: Mapping[str, str]) -> None:
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

    def _lock(self, session: Session, dataset: str) -> Optional[DatasetRow]:
        if self.engine.dialect.name == "postgresql":
            # serialise reservations, commits and the registration of one dataset (an advisory lock, not FOR
            # UPDATE: that needs UPDATE on the dataset's row, which a worker is not given)
            session.execute(text("SELECT pg_advisory_xact_lock(hashtext(:d))"), {"d": dataset})
            return session.scalars(select(DatasetRow).where(DatasetRow.dataset == dataset)).first()
        return session.get(DatasetRow, dataset)  # SQLite: BEGIN IMMEDIATE already holds the write lock

    @staticmethod
    def _check_terms(ds: DatasetRow, lifetime_epsilon: float, accountant: str, neighboring: str) -> None:
        if not math.isclose(ds.lifetime_epsilon, lifetime_epsilon):
            raise ValueError(f"budget.lifetime_epsilon: dataset {ds.dataset!r} is registered with "
                             f"{ds.lifetime_epsilon:g}, the spec says {lifetime_epsilon:g}; they must match")
        if ds.neighboring != neighboring:
            raise ValueError(f"privacy.neighboring: dataset {ds.dataset!r} is accounted under {ds.neighboring}, "
                             f"the spec says {neighboring}")
        if ds.accountant != accountant:
            raise ValueError(f"privacy.accountant: dataset {ds.dataset!r} is accounted with {ds.accountant}, the "
                             f"spec says {accountant}; {FIXED}")

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
            self._blocks_written(session, ds)  # before this charge is committed: it is composed below
            row.status, row.executed_event, row.steps_run = COMMITTED, event_to_json(executed), steps_run
            row.run_id = run_id or row.run_id
            row.updated_at = _now()
            # under pld a run counts as planned (see the module's note on filters)
            folded = event_from_json(row.planned_event) if ds.accountant == "pld" else executed
            increment = ComposedState(Accountant(ds.accountant, ds.neighboring)).composed([folded])
            for link in session.scalars(select(ChargeBlockRow).where(ChargeBlockRow.charge_id == charge_id)):
                block = session.get(BlockRow, (row.dataset, link.block))
                state = ComposedState.from_json(block.committed).plus(increment)
                block.committed, block.committed_epsilon = state.to_json(), state.epsilon(block.delta)

    def abort(self, charge_id: str) -> None:
        """Release a reservation whose run never queried private data."""
        with Session(self.engine) as session, session.begin():
            row = session.get(ChargeRow, charge_id)
            if row is not None and row.status == RESERVED:
                row.status, row.updated_at = ABORTED, _now()
