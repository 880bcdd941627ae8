"""The ledger owner's acts: ``privzo budget init DATASET`` registers a dataset's terms (its lifetime), and
``privzo budget grant ROLE`` gives a PostgreSQL role a worker's or a viewer's rights. Both need the credentials
of the ledger's owner (a worker's are refused)."""
from __future__ import annotations

import specs
from flows.cli.budget.parsing import action_parser
from flows.cli.common import fail


def add_parsers(actions) -> None:
    a = action_parser(actions, "init", "the dataset to register", "DATASET", "the ledger owner's: register a dataset's "
                      "terms", init)
    a.add_argument("--spec", default=None, help="the spec whose budget, privacy and data.blocks give all its terms")
    a.add_argument("--lifetime-epsilon", type=float, default=None, help="the lifetime epsilon of a dataset without "
                   "blocks (without --spec)")
    a.add_argument("--delta", type=float, default=None, help="the lifetime's delta (with --spec: only where its "
                   "privacy.delta is auto)")
    a.add_argument("--accountant", choices=["rdp", "pld", "zcdp"], default="rdp", help="(default rdp)")
    a.add_argument("--neighboring", choices=["add_remove", "replace_one"], default="add_remove",
                   help="(default add_remove)")
    a = action_parser(actions, "grant", "an existing PostgreSQL role", "ROLE", "the ledger owner's: a worker's or a "
                      "viewer's rights", grant)
    a.add_argument("--read-only", action="store_true", help="a viewer's rights (read), not a worker's")


def init(args) -> int:
    """Register the dataset's terms: a spec's, or the flags' (a dataset without blocks)."""
    from sqlalchemy.exc import SQLAlchemyError

    from flows.ledger import PrivacyLedger, driver_reason, shown_url

    where = shown_url(args.ledger)
    try:
        terms = _init_terms(args)
        ledger = PrivacyLedger.open(args.ledger)
        if not ledger.may_register():
            return fail(f"--ledger: this role may not register datasets in {where}; a dataset's lifetime is set "
                         "with the ledger owner's credentials")
        new = ledger.register(terms)
    except SQLAlchemyError as err:
        return fail(f"--ledger: {where}: {driver_reason(err)}")
    print(f"{terms.dataset}: {'registered' if new else 'already registered'} in {where} with lifetime epsilon "
          f"{terms.lifetime_epsilon:g} at delta {terms.delta:g} ({terms.accountant}, {terms.neighboring}), "
          f"{terms.described()}; runs charged to it are admitted within that, each block's own with data.blocks, "
          "and a run whose spec has other terms is refused")
    return 0


def grant(args) -> int:
    """Give the role (``args.dataset``: the action's one argument) a worker's or, read-only, a viewer's rights."""
    from sqlalchemy.exc import SQLAlchemyError

    from flows.ledger import PrivacyLedger, driver_reason, shown_url

    where = shown_url(args.ledger)
    try:
        ledger = PrivacyLedger.open(args.ledger)
        for statement in ledger.grant(args.dataset, read_only=args.read_only):
            print(statement)
    except SQLAlchemyError as err:
        return fail(f"--ledger: {where}: {driver_reason(err)}")
    print(f"{args.dataset} may now {'read' if args.read_only else 'read and charge registered datasets of'} "
          f"the ledger {where}")
    return 0


def _init_terms(args):
    """The terms ``budget init`` registers: a spec's (its budget, privacy and data.blocks sections), or the
    flags' (a dataset without blocks)."""
    import dataclasses

    from flows.ledger import DatasetTerms

    if args.delta is not None and not 0 < args.delta < 1:
        raise ValueError(f"--delta: {args.delta:g} is not between 0 and 1")
    if args.spec:
        if args.lifetime_epsilon is not None:
            raise ValueError("--lifetime-epsilon: give the terms by --spec or by flags, not both")
        spec = specs.load_spec(args.spec)
        if spec.budget is None:
            raise ValueError(f"--spec: {args.spec} has no budget section, so it charges no dataset")
        if spec.budget.dataset != args.dataset:
            raise ValueError(f"--spec: {args.spec} charges dataset {spec.budget.dataset!r}, not {args.dataset!r}")
        terms = DatasetTerms.of(spec)
        if terms.delta is not None and args.delta is not None:
            raise ValueError(f"--delta: {args.spec} gives its delta ({terms.delta:g}); --delta is for a spec whose "
                             "privacy.delta is auto")
        return dataclasses.replace(terms, delta=terms.delta if args.delta is None else args.delta)
    if args.lifetime_epsilon is None or args.delta is None:
        raise ValueError(f"{'--delta' if args.lifetime_epsilon else '--lifetime-epsilon'}: budget init needs --spec "
                         "SPEC, or --lifetime-epsilon and --delta")
    if not args.lifetime_epsilon > 0:
        raise ValueError(f"--lifetime-epsilon: {args.lifetime_epsilon:g} is not above 0")
    import re

    from specs.sections.budget import DATASET_PATTERN

    if not re.fullmatch(DATASET_PATTERN, args.dataset):
        raise ValueError(f"DATASET: {args.dataset!r} is not a dataset id (a letter or digit, then letters, digits "
                         "and . _ : -)")
    return DatasetTerms(args.dataset, args.lifetime_epsilon, args.delta, args.accountant, args.neighboring)
