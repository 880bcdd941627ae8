"""``LeaseBook``: how the ledger settles a charge (``_fold``: committed and folded into its blocks, by a run's
commit or a settlement) and its reservation leases (``flows.ledger.leases``: renewal, settlement of the ones
that ran out, the open ones listed), as methods ``PrivacyLedger`` has; they use its ``engine``, ``_lock``,
``_blocks_written``, ``datasets`` and ``_terms_columns_kept``."""
from __future__ import annotations

import datetime as dt
import logging
from typing import Dict, List, Optional

from sqlalchemy import select
from sqlalchemy.orm import Session, undefer_group

import flows.ledger.leases as leases
from components.accountants import Accountant, event_from_json, event_to_json
from components.accountants.composed import ComposedState
from flows.ledger.schema import ABORTED, COMMITTED, RESERVED, BlockRow, ChargeBlockRow, ChargeRow, DatasetRow, utc_now

_LOG = logging.getLogger(__name__)


class LeaseBook:
    def _fold(self, session: Session, ds: DatasetRow, row: ChargeRow, executed_json: str, steps_run: int,
              run_id: Optional[str]) -> None:
        """Commit ``row`` at ``executed_json`` over ``steps_run`` and fold it into its blocks, in the caller's
        transaction holding the dataset's lock."""
        self._blocks_written(session, ds)  # before this charge is committed: it is composed below
        row.status, row.executed_event, row.steps_run = COMMITTED, executed_json, steps_run
        row.run_id = run_id or row.run_id
        row.updated_at = utc_now()
        if self.terms_kept:
            row.lease_until = None  # settled: nothing holds it any more
        session.flush()  # the charge is committed before its blocks move: the ledger's rules check that order
        # under pld a run counts as planned (see flows.ledger.admission's note on filters)
        folded = event_from_json(row.planned_event) if ds.accountant == "pld" else event_from_json(executed_json)
        increment = ComposedState(Accountant(ds.accountant, ds.neighboring)).composed([folded])
        for link in session.scalars(select(ChargeBlockRow).where(ChargeBlockRow.charge_id == row.id)):
            block = session.get(BlockRow, (row.dataset, link.block))
            state = ComposedState.from_json(block.committed).plus(increment)
            block.committed, block.committed_epsilon = state.to_json(), state.epsilon(block.delta)

    def renew(self, charge_id: str, *, bound: Optional[tuple] = None, planned: bool = False,
              run_id: Optional[str] = None) -> None:
        """Extend a reservation's lease; with ``bound`` (event, steps) also record what the run is charged if it
        dies before its next bound, with ``planned`` its planned run whole. One statement, on a charge still
        reserved: raises ``LeaseLost`` where it is not (settled after its lease ran out, or closed)."""
        from sqlalchemy import update

        self._terms_columns_kept()
        values: Dict[str, object] = {"lease_until": leases.lease_end(utc_now())}
        if planned:
            values.update(bound_event=ChargeRow.planned_event, bound_steps=ChargeRow.steps_planned)
        elif bound is not None:
            values.update(bound_event=event_to_json(bound[0]), bound_steps=int(bound[1]))
        if run_id is not None:
            values["run_id"] = run_id
        with Session(self.engine) as session, session.begin():
            done = session.execute(update(ChargeRow).where(ChargeRow.id == charge_id, ChargeRow.status == RESERVED)
                                   .values(**values).execution_options(synchronize_session=False)).rowcount
        if not done:
            raise leases.LeaseLost(charge_id, self.status(charge_id))

    def settle_expired(self, dataset: Optional[str] = None, *, now: Optional["dt.datetime"] = None) -> List[leases.Settled]:
        """Settle every reservation (of ``dataset``, or of every dataset) whose lease ran out: committed at its
        recorded bound, or aborted where it recorded none (``flows.ledger.leases`` says why this never
        under-charges). A reservation without a lease (made by an earlier privzo) is left to its resume."""
        if not self.terms_kept:
            return []
        names = [dataset] if dataset is not None else self.datasets()
        settled: List[leases.Settled] = []
        for name in names:
            with Session(self.engine) as session, session.begin():
                ds = self._lock(session, name)
                if ds is not None:
                    settled += self._settle_expired(session, ds, now)
        return settled

    def _settle_expired(self, session: Session, ds: DatasetRow, now: Optional["dt.datetime"] = None) -> List[leases.Settled]:
        """``settle_expired`` for one dataset, in the caller's transaction holding its lock. Each charge's row is
        locked before its lease and bound are read, so a renewal either lands first (the lease is then not
        expired) or finds the charge settled."""
        now = now or utc_now()
        expired = list(session.scalars(
            select(ChargeRow).where(ChargeRow.dataset == ds.dataset, ChargeRow.status == RESERVED,
                                    ChargeRow.lease_until.is_not(None), ChargeRow.lease_until < now)
            .options(undefer_group("lease")).order_by(ChargeRow.created_at).with_for_update()))
        settled = []
        for row in expired:
            session.refresh(row, with_for_update=True)
            if row.status != RESERVED or row.lease_until is None or not row.lease_until < now:
                continue  # renewed, or settled by another, while this waited for its row
            until = row.lease_until
            if row.bound_event is None:  # no chunk began: no private query was made
                row.status, row.updated_at, row.lease_until = ABORTED, utc_now(), None
                settled.append(leases.Settled(row.id, ds.dataset, row.run_name, ABORTED, 0, until))
            else:
                self._fold(session, ds, row, row.bound_event, int(row.bound_steps), None)
                settled.append(leases.Settled(row.id, ds.dataset, row.run_name, COMMITTED, int(row.bound_steps), until))
        if settled:
            session.flush()
            for s in settled:
                _LOG.warning("%s", s.line())
        return settled

    def open_reservations(self, dataset: str) -> List[tuple]:
        """The dataset's reservations still open, oldest first: (charge id, run name, created, lease until or
        None for one without a lease, bound steps or None, steps planned)."""
        with Session(self.engine) as session:
            rows = session.scalars(select(ChargeRow).where(ChargeRow.dataset == dataset, ChargeRow.status == RESERVED)
                                   .options(*([undefer_group("lease")] if self.terms_kept else []))
                                   .order_by(ChargeRow.created_at))
            return [(r.id, r.run_name, r.created_at, r.lease_until if self.terms_kept else None,
                     r.bound_steps if self.terms_kept else None, r.steps_planned) for r in rows]
