"""``privzo budget``: a dataset's ledger shown and checked (show, history), its dead runs' reservations settled
(settle), its terms registered and roles
granted by the ledger's owner (init, grant), its ids re-keyed by the owner (migrate-ids), and nights of a spec
on blocks played on a scratch ledger (simulate). Each action is a module of its own, owning its parser."""
from __future__ import annotations

from flows.cli.budget import migrate_ids, owner, settle, show, simulate

ACTIONS = (show, settle, simulate, owner, migrate_ids)


def add_parser(sub) -> None:
    p = sub.add_parser("budget", help="a dataset's privacy budget in the ledger: show | history | settle DATASET; simulate "
                       "SPEC plays nights of a spec on blocks on a scratch ledger; the ledger owner's: init DATASET "
                       "registers its lifetime, grant ROLE")
    actions = p.add_subparsers(dest="action", required=True, metavar="{show,history,settle,simulate,init,grant,migrate-ids}")
    for action in ACTIONS:
        action.add_parsers(actions)
