"""``privzo budget settle DATASET``: settle the dataset's reservations whose lease ran out (a run that died),
as the next reservation on it would: each committed at the bound its run recorded, or released where it
recorded no private query (flows.ledger.leases says why that never under-charges)."""
from __future__ import annotations

from flows.cli.budget.parsing import action_parser
from flows.cli.common import fail


def add_parsers(actions) -> None:
    action_parser(actions, "settle", "the dataset", "DATASET", "settle the dataset's reservations whose lease ran out "
                  "(runs that died): each at the bound its run recorded", settle)


def settle(args) -> int:
    from flows.cli.budget.show import read_ledger

    return read_ledger(args, _settle)


def _settle(args, ledger) -> int:
    if ledger.dataset(args.dataset) is None:
        return fail(f"DATASET: no dataset {args.dataset!r} in the ledger (known: {', '.join(ledger.datasets()) or 'none'})")
    settled = ledger.settle_expired(args.dataset)
    for s in settled:
        print(s.line())
    live = [r for r in ledger.open_reservations(args.dataset)]
    if not settled:
        print(f"{args.dataset}: no reservation whose lease ran out; {len(live)} open (privzo budget show names them)")
    return 0
