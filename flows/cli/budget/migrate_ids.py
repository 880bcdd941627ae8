"""``privzo budget migrate-ids DATASET --spec SPEC``: the ledger owner's once-only re-keying of a dataset whose
rows keep their people but not their identity (the re-keying itself: id_migration.py)."""
from __future__ import annotations

import specs
from flows.cli.budget.parsing import action_parser
from flows.cli.common import fail


def add_parsers(actions) -> None:
    a = action_parser(actions, "migrate-ids", "the dataset to re-key", "DATASET", "the ledger owner's: re-key a "
                      "dataset whose rows keep their people but not their identity (ids an earlier privzo read by type "
                      "inference, an id column moved between integers and text, rows read by content moving to a source "
                      "with a key), once", migrate_ids)
    a.add_argument("--spec", required=True, help="the spec of the runs on it; its source must hold every person and "
                   "row earlier runs recorded")


def migrate_ids(args) -> int:
    """The owner's once-only re-keying of a dataset's persons and rows to the identity its source has now."""
    from sqlalchemy.exc import SQLAlchemyError

    from flows.cli.budget.id_migration import migrate
    from flows.ledger import driver_reason, shown_url

    where = shown_url(args.ledger)
    spec = specs.load_spec(args.spec)
    if spec.budget is None or spec.budget.dataset != args.dataset:
        return fail(f"--spec: {args.spec} charges {'no dataset' if spec.budget is None else repr(spec.budget.dataset)},"
                    f" not {args.dataset!r}")
    try:
        counts = migrate(spec, args.ledger)
    except SQLAlchemyError as err:
        return fail(f"--ledger: {where}: {driver_reason(err)}")
    if not counts:
        print(f"{args.dataset}: nothing to migrate in {where} (its rows are recorded with this identity, or no run "
              "recorded any)")
        return 0
    print(f"{args.dataset}: re-keyed in {where} to the identity of {args.spec}: {counts.get('person', 0)} persons, "
          f"{counts.get('row', 0)} row blocks, {counts.get('private', 0)} private rows; its runs match them from now on")
    return 0
