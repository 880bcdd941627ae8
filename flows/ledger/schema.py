"""The ledger's tables (SQLAlchemy), the states of a charge and the names the tables use for a dataset's blocks,
and what a worker role may write of them."""
from __future__ import annotations

import datetime as dt
from typing import Dict

from sqlalchemy import Column, DateTime, Float, ForeignKeyConstraint, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, deferred

RESERVED, COMMITTED, ABORTED = "reserved", "committed", "aborted"
WHOLE = "all"  # the block of a dataset charged as one: every dataset before blocks, and any without them
NO_BLOCKS = "none"  # DatasetRow.blocks of a dataset registered without blocks (NULL: registered before terms)

# What a worker (a role that runs specs) may write, besides reading every table: table -> the columns it may
# update. Nothing may be deleted, a dataset's terms are the owner's (privzo_datasets is not here), and a
# block's terms are fixed by its foreign key; rows keep the block they were first seen in.
WORKER_GRANTS: Dict[str, tuple] = {
    "privzo_charges": ("status", "executed_event", "steps_run", "run_id", "updated_at", "lease_until", "bound_event",
                       "bound_steps"),
    "privzo_charge_blocks": (),
    "privzo_blocks": ("committed", "committed_epsilon"),
    "privzo_private_rows": (),
    "privzo_row_blocks": (),
    "privzo_row_layouts": (),
}


class LedgerBase(DeclarativeBase):
    pass


class DatasetRow(LedgerBase):
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


class PrivateRowRow(LedgerBase):
    """A row (content fingerprint) some run on the dataset reserved as private."""

    __tablename__ = "privzo_private_rows"
    # exposure and laundering look a row up in every dataset
    __table_args__ = (Index("privzo_private_rows_row", "row"),)
    dataset = Column(String(200), primary_key=True)
    row = Column(String(64), primary_key=True)


class RowLayoutRow(LedgerBase):
    """What the dataset's row fingerprints are computed from (Table.layout), fixed by its first run."""

    __tablename__ = "privzo_row_layouts"
    dataset = Column(String(200), primary_key=True)
    layout = Column(Text, nullable=False)


class BlockRow(LedgerBase):
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


class ChargeBlockRow(LedgerBase):
    """A charge on one block it read."""

    __tablename__ = "privzo_charge_blocks"
    charge_id = Column(String(36), primary_key=True)
    block = Column(String(200), primary_key=True)
    dataset = Column(String(200), nullable=False, index=True)


class RowBlockRow(LedgerBase):
    """The block a row (keyed fingerprint) was in when a run first saw it; with persons, the block a person
    (keyed) first arrived in. Later runs read it, so a row written again with a new date keeps its block."""

    __tablename__ = "privzo_row_blocks"
    # laundering looks a person up in every dataset
    __table_args__ = (Index("privzo_row_blocks_key", "kind", "key"),)
    dataset = Column(String(200), primary_key=True)
    kind = Column(String(8), primary_key=True)  # row | person
    key = Column(String(64), primary_key=True)
    block = Column(String(200), nullable=False)


class ChargeRow(LedgerBase):
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
    # a reservation's lease (docs/design.md, Leases): the run renews it while it lives, and before each
    # chunk's first private query records what it is charged if it dies in that chunk (bound_event over
    # bound_steps; NULL: no private query yet). Added to ledgers made before them by migrations.migrate,
    # so nullable, and deferred: a role reading a PostgreSQL ledger its owner has not migrated still reads it.
    lease_until = deferred(Column(DateTime, nullable=True), group="lease")
    bound_event = deferred(Column(Text, nullable=True), group="lease")
    bound_steps = deferred(Column(Integer, nullable=True), group="lease")


LEASE_COLUMNS = ("lease_until", "bound_event", "bound_steps")


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


class PromotionBase(DeclarativeBase):
    """Tables only the ledger's owner makes and writes (created by its connection, never a worker's)."""


class PromotionRow(PromotionBase):
    """What ``privzo verify --promote`` checked and promoted: a registered model's alias, the version it was set
    on and the SHA-256 of every file of that version's model, so a consumer's load refuses other bytes or an
    alias moved by anyone else. A worker may read it, never write it (it is in no grant of WORKER_GRANTS)."""

    __tablename__ = "privzo_promotions"
    model = Column(String(200), primary_key=True)
    alias = Column(String(100), primary_key=True)
    version = Column(String(20), nullable=False)
    run_id = Column(String(64), nullable=False)
    digests = Column(Text, nullable=False)  # JSON: {relative path: sha256}
    promoted_at = Column(DateTime, nullable=False)
