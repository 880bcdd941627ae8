"""The arguments every ``privzo budget`` action shares: what it acts on, and the ledger it reads."""
from __future__ import annotations

from specs.sections import LEDGER_URL_ENV, ledger_from_env


def action_parser(actions, name: str, what: str, metavar: str, helped: str, command, ledger: bool = True):
    a = actions.add_parser(name, help=helped)
    a.add_argument("dataset", metavar=metavar, help=what)
    a.set_defaults(func=command)
    if ledger:
        a.add_argument("--ledger", default=ledger_from_env(), help=f"SQLAlchemy URL of the ledger (default: "
                       f"${LEDGER_URL_ENV}, else ~/.privzo/privacy-ledger.db)")
    return a
