"""Making the ledger's tables, and bringing a ledger an earlier privzo made up to them: the datasets' block
terms, the indexes the checks across datasets use, the rules every role is held to (integrity), and (when
its owner grants roles) the constraint that ties a block's terms to its dataset's."""
from __future__ import annotations

import os
from typing import List

from sqlalchemy import text
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.engine import Engine

from flows.ledger.integrity import install_rules
from flows.ledger.schema import (LEASE_COLUMNS, TERM_COLUMNS, BlockRow, ChargeRow, DatasetRow, LedgerBase, PrivateRowRow,
                                 PromotionBase, RowBlockRow)


def prepare(engine: Engine) -> bool:
    """Create the tables that are missing and migrate (``migrate``); whether the terms and lease columns are there."""
    if engine.dialect.name == "postgresql":
        # first use by several runs at once: one creates the tables, the others then find them
        with engine.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('privzo ledger schema'))"))
            LedgerBase.metadata.create_all(conn)
            return migrate(engine, conn)
    LedgerBase.metadata.create_all(engine)
    with engine.begin() as conn:
        return migrate(engine, conn)


def owns_tables(conn) -> bool:  # noqa: ANN001 - a SQLAlchemy connection
    """PostgreSQL: whether this connection's role owns the ledger's tables (or is a member of their owner)."""
    return bool(conn.execute(text("SELECT pg_has_role(current_user, tableowner, 'USAGE') FROM pg_tables "
                                  "WHERE schemaname = current_schema() AND tablename = :t"),
                             {"t": DatasetRow.__tablename__}).scalar())


def migrate(engine: Engine, conn) -> bool:  # noqa: ANN001 - a SQLAlchemy connection in a transaction
    """Bring a ledger an earlier privzo made up to these tables (the datasets' block terms, the indexes the
    checks across datasets use, the charges' leases); whether the terms and lease columns are there. A SQLite file is migrated by
    whoever may write it; a PostgreSQL ledger only by its tables' owner, as ``grant`` migrates it, so a
    worker's or viewer's open leaves it as it is (they then read it, and a worker's run is refused
    until the owner has opened it once)."""
    have = {c["name"] for c in sa_inspect(conn).get_columns(DatasetRow.__tablename__)}
    leased = {c["name"] for c in sa_inspect(conn).get_columns(ChargeRow.__tablename__)}
    missing = [(DatasetRow, c) for c in TERM_COLUMNS if c not in have] + \
        [(ChargeRow, c) for c in LEASE_COLUMNS if c not in leased]
    if engine.dialect.name == "sqlite":
        path = engine.url.database
        if path and not os.access(path, os.W_OK):
            return not missing
    elif engine.dialect.name == "postgresql":
        if not owns_tables(conn):
            return not missing
    for row, name in missing:  # nullable: registered datasets keep NULL until they adopt terms, charges their lease
        kind = row.__table__.c[name].type.compile(conn.dialect)
        conn.execute(text(f"ALTER TABLE {row.__tablename__} ADD COLUMN {name} {kind}"))
    for table in (PrivateRowRow.__table__, RowBlockRow.__table__):
        for index in table.indexes:
            index.create(conn, checkfirst=True)
    PromotionBase.metadata.create_all(conn)  # the owner's alone: a worker's connection never makes them
    if engine.dialect.name == "postgresql":  # what no role may write, whatever SQL it sends
        install_rules(conn)
    return True


def grant_constraints(conn) -> List[str]:  # noqa: ANN001 - a SQLAlchemy connection
    """PostgreSQL, at ``grant``: the statements that add the foreign key tying every block's terms to its
    dataset's, for a ledger made before blocks were tied to them (none for a later one)."""
    fks = {fk["name"] for fk in sa_inspect(conn).get_foreign_keys(BlockRow.__tablename__)}
    if "privzo_blocks_terms" in fks:
        return []
    return [
        "ALTER TABLE privzo_datasets ADD CONSTRAINT privzo_datasets_terms UNIQUE (dataset, lifetime_epsilon, delta)",
        "ALTER TABLE privzo_blocks ADD CONSTRAINT privzo_blocks_terms FOREIGN KEY (dataset, lifetime_epsilon, "
        "delta) REFERENCES privzo_datasets (dataset, lifetime_epsilon, delta)"]
