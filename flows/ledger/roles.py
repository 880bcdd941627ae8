"""The ledger's roles on PostgreSQL: what a connection may write (a charge's tables and columns, a dataset's
registration), and the grants that make a role a worker or a viewer. A SQLite file has no roles: whoever
may write it is its owner."""
from __future__ import annotations

import os
import re
from typing import List

from sqlalchemy import text
from sqlalchemy.engine import Engine

from flows.ledger.migrations import grant_constraints, owns_tables
from flows.ledger.schema import WORKER_GRANTS, DatasetRow, LedgerBase, PromotionBase


def missing_write_grants(engine: Engine) -> List[str]:
    """What of the ledger this connection may not write as a charge does (``WORKER_GRANTS``), as
    "TABLE" or "COLUMN of TABLE": none for its owner or a worker; a read-only role (a viewer's) misses
    them all. A SQLite file must be writable."""
    if engine.dialect.name == "sqlite":
        path = engine.url.database
        return [] if not path or os.access(path, os.W_OK) else sorted(WORKER_GRANTS)
    if engine.dialect.name != "postgresql":
        return []
    missing = []
    with engine.connect() as conn:
        for table, columns in sorted(WORKER_GRANTS.items()):
            if not conn.execute(text("SELECT has_table_privilege(current_user, :t, 'INSERT')"), {"t": table}).scalar():
                missing.append(table)
                continue
            missing += [f"{c} of {table}" for c in columns if not conn.execute(
                text("SELECT has_column_privilege(current_user, :t, :c, 'UPDATE')"), {"t": table, "c": c}).scalar()]
    return missing


def may_register(engine: Engine) -> bool:
    """Whether this connection may register datasets (the owner's act): a SQLite file's writer always."""
    if engine.dialect.name != "postgresql":
        return True
    with engine.connect() as conn:
        return bool(conn.execute(text("SELECT has_table_privilege(current_user, :t, 'INSERT')"),
                                 {"t": DatasetRow.__tablename__}).scalar())


def grant(engine: Engine, role: str, read_only: bool = False) -> List[str]:
    """Give ``role`` (an existing PostgreSQL role) what a worker needs (``WORKER_GRANTS``: read
    everything, charge registered datasets) or, ``read_only``, what a viewer needs (read everything);
    the statements run, in order. Only the tables' owner may grant; nothing else is given (no delete, no
    dataset registration, no lifetime)."""
    if engine.dialect.name != "postgresql":
        raise ValueError(f"budget grant: a {engine.dialect.name} ledger has no roles (whoever may write "
                         "its file may spend it); roles need a PostgreSQL ledger")
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", role):
        raise ValueError(f"budget grant: {role!r} is not a role name (lower-case letters, digits and _, "
                         "starting with a letter or _)")
    statements = ["GRANT USAGE ON SCHEMA {schema} TO {role}"]
    statements += [f"GRANT SELECT ON {t} TO {{role}}" for t in sorted(LedgerBase.metadata.tables)
                   + sorted(PromotionBase.metadata.tables)]
    if not read_only:
        for table, columns in sorted(WORKER_GRANTS.items()):
            statements.append(f"GRANT INSERT ON {table} TO {{role}}")
            if columns:
                statements.append(f"GRANT UPDATE ({', '.join(columns)}) ON {table} TO {{role}}")
    with engine.begin() as conn:
        exists = conn.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).scalar()
        if not exists:
            raise ValueError(f"budget grant: there is no role {role!r} on this server; its administrator "
                             f"creates it first (CREATE ROLE {role} LOGIN PASSWORD '...')")
        schema = conn.execute(text("SELECT current_schema()")).scalar()
        # PostgreSQL only warns when a role without the grant option grants: check ownership first
        if not owns_tables(conn):
            raise ValueError("budget grant: only the ledger's owner (the role that owns its tables) grants; "
                             "connect with the owner's credentials")
        statements[:0] = grant_constraints(conn)  # a ledger made before blocks were tied to their dataset's terms
        done = [s.format(schema=schema, role=role) for s in statements]
        for statement in done:
            conn.execute(text(statement))
    return done
