"""The ledger's record of promotions (``privzo_promotions``, its owner's alone: a worker and a viewer read it):
which version of a registered model its owner verified and promoted to an alias, and the SHA-256 of every
file of it. flows/record/promotion.py asks these; nothing else reads the table."""
from __future__ import annotations

import datetime as dt
import json
from typing import TYPE_CHECKING, Dict

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

if TYPE_CHECKING:
    from flows.ledger.core import PrivacyLedger

VERIFIED = "verified"


def record(ledger: "PrivacyLedger", name: str, version: str, run_id: str, digests: Dict[str, str],
           alias: str = VERIFIED) -> None:
    """The owner's record of a promotion (replacing the alias's earlier one)."""
    from flows.ledger.schema import PromotionRow

    with Session(ledger.engine) as session, session.begin():
        session.execute(delete(PromotionRow).where(PromotionRow.model == name, PromotionRow.alias == alias))
        session.add(PromotionRow(model=name, alias=alias, version=str(version), run_id=run_id,
                                 digests=json.dumps(digests, sort_keys=True),
                                 promoted_at=dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)))


def withdraw(ledger: "PrivacyLedger", name: str, alias: str = VERIFIED) -> None:
    from flows.ledger.schema import PromotionRow

    with Session(ledger.engine) as session, session.begin():
        session.execute(delete(PromotionRow).where(PromotionRow.model == name, PromotionRow.alias == alias))


def promoted(ledger: "PrivacyLedger", name: str, alias: str = VERIFIED):
    """The owner's record of ``alias`` on model ``name``, or None."""
    from sqlalchemy.exc import SQLAlchemyError

    from flows.ledger.schema import PromotionRow

    try:
        with Session(ledger.engine) as session:
            return session.scalars(select(PromotionRow).where(PromotionRow.model == name,
                                                              PromotionRow.alias == alias)).first()
    except SQLAlchemyError:  # a ledger made before promotions were recorded holds none
        return None
