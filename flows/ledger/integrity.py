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
import threading
from collections import OrderedDict
from typing import Dict, Iterable, List, Optional, Sequence

import dp_accounting
from sqlalchemy import text

from components.accountants import Accountant, event_from_json
from components.accountants.composed import ComposedState

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


def unrun_charges(ledger, dataset: str) -> List[str]:  # noqa: ANN001 - a PrivacyLedger
    """``privzo budget show --check``'s notes: one line per committed charge of ``dataset`` that ran no step
    and names no MLflow run. privzo commits one when a run ends between its reservation and its first step
    (its MLflow run not yet opened); a role that may charge can commit one that no run made. Either adds
    nothing to any block, and admission recomposes the blocks from the charges, so it hides nothing: named,
    not counted as a problem."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from flows.ledger.schema import COMMITTED, ChargeRow

    with Session(ledger.engine) as session:
        found = session.scalars(select(ChargeRow).where(
            ChargeRow.dataset == dataset, ChargeRow.status == COMMITTED, ChargeRow.steps_run == 0,
            ChargeRow.run_id.is_(None)).order_by(ChargeRow.created_at))
        return [f"charge {r.id} (run {r.run_name!r}) was committed with 0 of its {r.steps_planned} steps run and no "
                "MLflow run: a run that ended before its first step, or a charge no run made; it adds nothing"
                for r in found]


def _close(a: float, b: float) -> bool:
    # another machine's summation order moves an epsilon in its last digits, never more
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def recomposed_epsilon(accountant: str, neighboring: str, events: Sequence[str], delta: float) -> float:
    """The epsilon at ``delta`` of a block's committed charges' counted events (JSON, in the order they were
    settled), as admission recomposes it before trusting the stored one. Under rdp and zcdp, whose
    compositions add up, each event's own composition is computed once and added, so the cost grows with the
    distinct events, not the history (bench/ledger_scale.py); under pld, copies of one planned event
    (admission's rule) are one self-composition each, not n convolutions (they agree to 1e-9 here; the
    check allows 1e-6)."""
    if not events:
        return 0.0
    state = ComposedState(Accountant(accountant, neighboring))
    if accountant == "pld":
        counts: Dict[str, int] = {}
        for event_json in events:
            counts[event_json] = counts.get(event_json, 0) + 1
        for event_json, n in sorted(counts.items()):
            state = state.plus(_event_state(accountant, neighboring, event_json, n))
    else:
        for event_json in events:
            state = state.plus(_event_state(accountant, neighboring, event_json, 1))
    return state.epsilon(delta)


# one event's composition by (accountant, neighboring, event, count): a pure function of its key (composed
# states are never changed in place), kept for the process's nightly runs that repeat it, whichever ledger
# object asks (an RDP curve or a PLD takes milliseconds to compute, adding two RDP curves microseconds)
_EVENT_STATES: "OrderedDict[tuple, ComposedState]" = OrderedDict()
_EVENT_STATES_LOCK = threading.Lock()


def _event_state(accountant: str, neighboring: str, event_json: str, count: int) -> ComposedState:
    key = (accountant, neighboring, event_json, count)
    with _EVENT_STATES_LOCK:
        state = _EVENT_STATES.get(key)
        if state is not None:
            _EVENT_STATES.move_to_end(key)
            return state
    event = event_from_json(event_json)
    state = ComposedState(Accountant(accountant, neighboring)).composed(
        [event if count == 1 else dp_accounting.SelfComposedDpEvent(event, count)])
    with _EVENT_STATES_LOCK:
        _EVENT_STATES[key] = state
        while len(_EVENT_STATES) > 64:
            _EVENT_STATES.popitem(last=False)
    return state
