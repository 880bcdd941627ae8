"""What keeps the ledger's record honest against a role that may write it.

On PostgreSQL, triggers the tables' owner installs (``install_rules``) hold every role to the rules
privzo's own code follows, whatever SQL it sends: a charge is inserted reserved with nothing executed; a
reserved charge may become committed (with an executed event of at most its planned steps) or aborted,
and what was reserved (dataset, rows, planned event and steps) never changes; a committed or aborted charge
never changes again; no charge or block is deleted; a block's stored composition changes only in the
transaction that commits a charge on that block. A worker does not own the tables, so it can neither drop
nor disable them.

What triggers cannot judge is arithmetic: in the transaction that commits a charge, a role could still
write another composition than the one the charge adds. ``recomposition_problems`` is the check for that,
run by ``privzo budget show --check`` and ``privzo verify``: every block's stored composition against the
composition of the events its committed charges count, recomputed from the charges."""
from __future__ import annotations

import math
from typing import Iterable, List, Optional

from sqlalchemy import text

# one name per version of the rules: a ledger whose triggers are of an older version gets the new ones
RULES_VERSION = "v1"
_CHARGES_FN, _BLOCKS_FN = f"privzo_charge_rules_{RULES_VERSION}", f"privzo_block_rules_{RULES_VERSION}"
_TRIGGERS = {f"privzo_charges_rules_{RULES_VERSION}": ("privzo_charges", _CHARGES_FN),
             f"privzo_blocks_rules_{RULES_VERSION}": ("privzo_blocks", _BLOCKS_FN)}

# the reserved columns of a charge: fixed from the moment it is reserved
_RESERVED = "id, dataset, fingerprint, run_name, planned_event, steps_planned, planned_epsilon, created_at"
_FIXED_BLOCK = "dataset, block, lifetime_epsilon, delta, rows, created_at"

_CHARGE_RULES = f"""
CREATE OR REPLACE FUNCTION {_CHARGES_FN}() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
  IF TG_OP = 'DELETE' THEN
    RAISE EXCEPTION 'privzo ledger: charge % cannot be deleted', OLD.id USING ERRCODE = '42501';
  END IF;
  IF TG_OP = 'INSERT' THEN
    IF NEW.status <> 'reserved' OR NEW.executed_event IS NOT NULL OR NEW.steps_run <> 0 THEN
      RAISE EXCEPTION 'privzo ledger: charge % must be inserted reserved, with nothing executed', NEW.id
        USING ERRCODE = '42501';
    END IF;
    RETURN NEW;
  END IF;
  IF OLD.status <> 'reserved' THEN
    RAISE EXCEPTION 'privzo ledger: charge % is %, and a settled charge never changes', OLD.id, OLD.status
      USING ERRCODE = '42501';
  END IF;
  IF ROW({', '.join('NEW.' + c.strip() for c in _RESERVED.split(','))})
     IS DISTINCT FROM ROW({', '.join('OLD.' + c.strip() for c in _RESERVED.split(','))}) THEN
    RAISE EXCEPTION 'privzo ledger: what charge % reserved ({_RESERVED}) cannot change', OLD.id
      USING ERRCODE = '42501';
  END IF;
  IF NEW.status = 'committed' THEN
    IF NEW.executed_event IS NULL OR NEW.steps_run < 0 OR NEW.steps_run > NEW.steps_planned THEN
      RAISE EXCEPTION 'privzo ledger: charge % commits with an executed event and at most its % planned steps',
        OLD.id, OLD.steps_planned USING ERRCODE = '42501';
    END IF;
  ELSIF NEW.status NOT IN ('reserved', 'aborted') OR NEW.executed_event IS NOT NULL OR NEW.steps_run <> 0 THEN
    RAISE EXCEPTION 'privzo ledger: charge % may only be committed or aborted', OLD.id USING ERRCODE = '42501';
  END IF;
  RETURN NEW;
END $$"""

_BLOCK_RULES = f"""
CREATE OR REPLACE FUNCTION {_BLOCKS_FN}() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
  IF TG_OP = 'DELETE' THEN
    RAISE EXCEPTION 'privzo ledger: block % of % cannot be deleted', OLD.block, OLD.dataset USING ERRCODE = '42501';
  END IF;
  IF TG_OP = 'INSERT' THEN  -- its terms are held by the foreign key, its composition by the recomposition check
    RETURN NEW;
  END IF;
  IF ROW({', '.join('NEW.' + c.strip() for c in _FIXED_BLOCK.split(','))})
     IS DISTINCT FROM ROW({', '.join('OLD.' + c.strip() for c in _FIXED_BLOCK.split(','))}) THEN
    RAISE EXCEPTION 'privzo ledger: block % of % keeps its terms', OLD.block, OLD.dataset USING ERRCODE = '42501';
  END IF;
  -- a composition moves only with a charge on the block committed by this very transaction (its row
  -- version's xmin is this transaction's id)
  IF (NEW.committed IS DISTINCT FROM OLD.committed OR NEW.committed_epsilon IS DISTINCT FROM OLD.committed_epsilon)
     AND NOT EXISTS (
       SELECT 1 FROM privzo_charges c JOIN privzo_charge_blocks l ON l.charge_id = c.id
       WHERE l.dataset = NEW.dataset AND l.block = NEW.block AND c.status = 'committed'
         AND c.xmin::text = (txid_current() % 4294967296)::text) THEN
    RAISE EXCEPTION 'privzo ledger: block % of % changes its composition only with a charge on it committed in the same transaction',
      OLD.block, OLD.dataset USING ERRCODE = '42501';
  END IF;
  RETURN NEW;
END $$"""


def install_rules(conn) -> List[str]:  # noqa: ANN001 - a SQLAlchemy connection of the tables' owner
    """PostgreSQL: create the rules' functions and triggers that are missing (the owner's act, at ``prepare``
    and ``grant``); the statements run."""
    have = set(conn.execute(text("SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                                 "WHERE c.relnamespace = current_schema()::regnamespace")).scalars())
    missing = {name: target for name, target in _TRIGGERS.items() if name not in have}
    if not missing:
        return []
    done = [_CHARGE_RULES, _BLOCK_RULES]
    for name, (table, function) in sorted(missing.items()):
        done.append(f"CREATE TRIGGER {name} BEFORE INSERT OR UPDATE OR DELETE ON {table} "
                    f"FOR EACH ROW EXECUTE FUNCTION {function}()")
    for statement in done:
        conn.execute(text(statement))
    return done


def recomposition_problems(ledger, dataset: str, blocks: Optional[Iterable[str]] = None) -> List[str]:  # noqa: ANN001
    """One line per block of ``dataset`` (of ``blocks``, if given) whose stored composition is not what its
    committed charges compose to (the events they count: executed, or planned under pld), at the block's
    delta; none when all agree. ``ledger``: a PrivacyLedger."""
    problems, wanted = [], None if blocks is None else set(blocks)
    for block, stored, stored_state, recomposed, n in ledger.recomposed(dataset):
        if wanted is not None and block not in wanted:
            continue
        if not (_close(stored, recomposed) and _close(stored_state, recomposed)):
            problems.append(
                f"block {block!r} of dataset {dataset!r} stores epsilon {stored:.6g} (its stored composition: "
                f"{stored_state:.6g}), but its {n} committed charge{'s' if n != 1 else ''} compose to "
                f"{recomposed:.6g}: the ledger's record of this block was changed outside privzo")
    return problems


def ledger_problems(ledger, dataset: str) -> List[str]:  # noqa: ANN001 - a PrivacyLedger
    """``privzo budget show --check``: every committed charge of ``dataset`` whose executed event is not its
    reserved plan cut to the steps it ran, then every block whose stored composition is not its charges'."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from components.accountants import beyond_plan, event_from_json
    from flows.ledger.schema import COMMITTED, ChargeRow

    problems = []
    with Session(ledger.engine) as session:
        for r in session.scalars(select(ChargeRow).where(ChargeRow.dataset == dataset, ChargeRow.status == COMMITTED)
                                 .order_by(ChargeRow.created_at)):
            beyond = beyond_plan(event_from_json(r.planned_event), event_from_json(r.executed_event),
                                 (r.steps_planned, r.steps_run))
            if beyond is not None:
                problems.append(f"charge {r.id} (run {r.run_name!r}) committed an event beyond the one it "
                                f"reserved: {beyond}")
    return problems + recomposition_problems(ledger, dataset)


def _close(a: float, b: float) -> bool:
    # another machine's summation order moves an epsilon in its last digits, never more
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
