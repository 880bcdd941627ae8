"""``privzo budget``: a dataset's ledger shown and checked (show, history), its terms registered and roles
granted by the ledger's owner (init, grant), and nights of a spec on blocks played on a scratch ledger
(simulate). Each action has its own arguments (``budget_parsers``)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import specs
from flows.refusals import fail
from specs.sections import LEDGER_URL_ENV, ledger_from_env


def budget_parsers(p) -> None:
    """``privzo budget``'s actions, each with its own arguments."""
    actions = p.add_subparsers(dest="action", required=True, metavar="{show,history,simulate,init,grant,migrate-ids}")

    def action(name: str, what: str, metavar: str, helped: str):
        a = actions.add_parser(name, help=helped)
        a.add_argument("dataset", metavar=metavar, help=what)
        a.set_defaults(func=cmd_budget, spec=None, as_of=None, check=False)
        if name != "simulate":
            a.add_argument("--ledger", default=ledger_from_env(), help=f"SQLAlchemy URL of the ledger (default: "
                           f"${LEDGER_URL_ENV}, else ~/.privzo/privacy-ledger.db)")
        return a

    a = action("show", "the dataset", "DATASET", "a dataset's blocks, what each spent, what a next run fits")
    a.add_argument("--spec", default=None, help="the spec of the runs on this dataset's blocks; adds the blocks its "
                   "next run reads and those retired for it")
    a.add_argument("--as-of", default=None, help="with --spec: the moment of that next run, ISO 8601 (default: now)")
    a.add_argument("--check", action="store_true", help="recompute every block's composition from its charges and "
                   "each committed charge against its plan; exit 1 naming any difference")
    action("history", "the dataset", "DATASET", "a dataset's charges, one a run")
    a = action("simulate", "a spec on blocks", "SPEC", "play nights of a spec on blocks on a scratch ledger")
    a.add_argument("--nights", type=int, default=60, help="how many nights (default 60)")
    a.add_argument("--first", default=None, help="the first night, YYYY-MM-DD (default: the first whose window is "
                   "full)")
    a.add_argument("--out", default=None, help="the folder for its ledger, MLflow store and stream (default: a new "
                   "temporary folder)")
    a = action("init", "the dataset to register", "DATASET", "the ledger owner's: register a dataset's terms")
    a.add_argument("--spec", default=None, help="the spec whose budget, privacy and data.blocks give all its terms")
    a.add_argument("--lifetime-epsilon", type=float, default=None, help="the lifetime epsilon of a dataset without "
                   "blocks (without --spec)")
    a.add_argument("--delta", type=float, default=None, help="the lifetime's delta (with --spec: only where its "
                   "privacy.delta is auto)")
    a.add_argument("--accountant", choices=["rdp", "pld", "zcdp"], default="rdp", help="(default rdp)")
    a.add_argument("--neighboring", choices=["add_remove", "replace_one"], default="add_remove",
                   help="(default add_remove)")
    a = action("grant", "an existing PostgreSQL role", "ROLE", "the ledger owner's: a worker's or a viewer's rights")
    a.add_argument("--read-only", action="store_true", help="a viewer's rights (read), not a worker's")
    a = action("migrate-ids", "the dataset to re-key", "DATASET", "the ledger owner's: re-key a dataset whose rows "
               "keep their people but not their identity (ids an earlier privzo read by type inference, an id column "
               "moved between integers and text, rows read by content moving to a source with a key), once")
    a.add_argument("--spec", required=True, help="the spec of the runs on it; its source must hold every person and "
                   "row earlier runs recorded")


def cmd_budget(args) -> int:
    if args.action == "simulate":
        return cmd_simulate(args)
    if args.action in ("init", "grant"):
        return cmd_budget_owner(args)
    if args.action == "migrate-ids":
        return cmd_migrate_ids(args)
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    from flows.ledger import PrivacyLedger

    try:
        url = make_url(args.ledger)
    except ArgumentError:
        return fail(f"--ledger: {args.ledger!r} is not a database URL; e.g. sqlite:////ABSOLUTE/PATH.db or "
                     f"postgresql+psycopg://USER@HOST/DB")
    if url.get_backend_name() == "sqlite" and url.database and not os.path.exists(url.database):
        # reading must not create an empty ledger where the user mistyped a path
        print(_nothing_spent(args.dataset, f"no run has been charged to {args.ledger} yet (no file {url.database})"))
        return 0
    try:
        ledger = PrivacyLedger.open(args.ledger)
        return _show_budget(args, ledger)
    except SQLAlchemyError as err:
        reason = getattr(err, "orig", None) or err  # the driver's own message, not SQLAlchemy's page of context
        where = url.render_as_string(hide_password=True)
        return fail(f"--ledger: cannot read {where} ({str(reason).splitlines()[0]})")


def _show_budget(args, ledger) -> int:
    from flows.reporting import shown

    ds = ledger.dataset(args.dataset)
    if ds is None:
        known = ledger.datasets()
        where = ledger.engine.url.render_as_string(hide_password=True)  # a team ledger's URL may hold a password
        print(_nothing_spent(args.dataset, f"no run on it is recorded in {where}" + (
            f" (datasets there: {', '.join(known)})" if known else "")))
        return 0
    spec = _blocks_spec(args)
    window, refusal, states = _next_window(args, spec) if args.action == "show" else (None, None, {})
    spent = ledger.spent(args.dataset)
    blocks = ledger.blocks(args.dataset)
    if not ledger.history(args.dataset):  # registered by its owner (privzo budget init), not yet charged
        print(f"{args.dataset}: registered with lifetime epsilon {ds.lifetime_epsilon:g} at delta {shown(ds.delta, 3)} "
              f"({ds.accountant}, {ds.neighboring}); no run has been charged to it yet")
        if window is not None:
            print(f"the next run of {spec.name} (as of {window.as_of}) reads {len(window.blocks)} block"
                  f"{'s' if len(window.blocks) != 1 else ''}: {', '.join(window.blocks)}")
        return 0
    if args.action == "show":
        print(f"{args.dataset}: epsilon {shown(spent)} spent of the lifetime {ds.lifetime_epsilon:g} (the largest over "
              f"its {len(blocks)} block{'s' if len(blocks) != 1 else ''}; delta {shown(ds.delta, 3)}, {ds.accountant}, "
              f"{ds.neighboring})")
        print(f"{'block':24} {'first charged (UTC)':20} {'charges':>7} {'committed':>10} {'with open':>10} "
              f"{'lifetime':>9} {'rows':>6}" + ("  next run" if spec is not None else ""))
        for b in blocks:
            print(f"{b.block[:24]:24} {b.created_at:%Y-%m-%d %H:%M:%S}  {b.charges:>7} "
                  f"{shown(b.committed_epsilon):>10} {shown(b.epsilon):>10} {b.lifetime_epsilon:>9g} "
                  f"{'-' if b.rows is None else b.rows:>6}" + (f"  {states.get(b.block, '')}" if spec else ""))
        if window is not None:
            print(f"the next run of {spec.name} (as of {window.as_of}) reads {len(window.blocks)} block"
                  f"{'s' if len(window.blocks) != 1 else ''}: {', '.join(window.blocks)}")
        elif refusal is not None:
            print(f"the next run of {spec.name} would be refused: {refusal}")
        fits = ledger.next_fit(args.dataset)
        # composition is not subtraction: what is left depends on the next run's shape
        print("a next run shaped like the last one (its steps and sampling, more noise) fits up to epsilon "
              f"{shown(fits)}" if fits is not None else "no run shaped like the last one fits the blocks it read")
        return _checked(args, ledger) if args.check else 0
    print(f"{'created (UTC)':20} {'run':24} {'status':10} {'steps':>11} {'run epsilon':>12}  fingerprint")
    for c in ledger.history(args.dataset):
        eps = ledger.run_epsilon(c)
        print(f"{c.created_at:%Y-%m-%d %H:%M:%S} {c.run_name[:24]:24} {c.status:10} "
              f"{c.steps_run:>5}/{c.steps_planned:<5} {'none' if eps is None else shown(eps):>12}  {c.fingerprint[:12]}")
    print(f"total (exact composition, the largest over its blocks): {shown(spent)} of {ds.lifetime_epsilon:g}")
    return 0


def _checked(args, ledger) -> int:
    """``budget show --check``: the ledger's record recomputed from its charges; 1, naming each difference."""
    from flows.ledger import ledger_problems
    from flows.ledger.integrity import unrun_charges

    problems = ledger_problems(ledger, args.dataset)
    for problem in problems:
        print(f"check: {problem}", file=sys.stderr)
    for note in unrun_charges(ledger, args.dataset):
        print(f"check: note: {note}")
    if not problems:
        print(f"check: every committed charge of {args.dataset} executed its plan, and every block's stored "
              "composition is what its committed charges compose to")
    return 1 if problems else 0


def _nothing_spent(dataset: str, where: str) -> str:
    return (f"{dataset}: nothing spent yet: {where}. Its lifetime budget is what its owner registers (privzo "
            "budget init), else the budget.lifetime_epsilon of the first run charged to it; every run after is "
            "refused past it.")


def _blocks_spec(args):
    """--spec: the spec whose next run ``budget show`` describes (on blocks, charged to this dataset)."""
    if not getattr(args, "spec", None):
        return None
    spec = specs.load_spec(args.spec)
    if spec.data.blocks is None or spec.budget is None:
        raise ValueError(f"--spec: {args.spec} reads no blocks (no data.blocks); give the spec of runs on blocks")
    if spec.budget.dataset != args.dataset:
        raise ValueError(f"--spec: {args.spec} charges dataset {spec.budget.dataset!r}, not {args.dataset!r}")
    return spec


def _next_window(args, spec):
    if spec is None:
        return None, None, {}
    import datetime as dt

    from flows.window import as_of_moment, next_window

    try:
        moment = as_of_moment(args.as_of)
    except ValueError as err:
        raise ValueError(f"--as-of: {str(err).split(': ', 1)[1]}") from None
    return next_window(spec.model_copy(update={"budget": spec.budget.model_copy(update={"ledger": args.ledger})}),
                       moment.astimezone(dt.timezone.utc))


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


def cmd_budget_owner(args) -> int:
    """The ledger owner's acts: ``init`` registers a dataset's lifetime, ``grant`` gives a role a worker's or
    a viewer's rights. Both need the credentials of the ledger's owner (a worker's are refused)."""
    from sqlalchemy.exc import SQLAlchemyError

    from flows.ledger import PrivacyLedger, driver_reason, shown_url

    where = shown_url(args.ledger)
    try:
        terms = _init_terms(args) if args.action == "init" else None
        ledger = PrivacyLedger.open(args.ledger)
        if args.action == "grant":
            for statement in ledger.grant(args.dataset, read_only=args.read_only):
                print(statement)
            print(f"{args.dataset} may now {'read' if args.read_only else 'read and charge registered datasets of'} "
                  f"the ledger {where}")
            return 0
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


def cmd_migrate_ids(args) -> int:
    """The owner's once-only re-keying of a dataset's persons and rows to the identity its source has now."""
    from sqlalchemy.exc import SQLAlchemyError

    from flows.id_migration import migrate
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


def cmd_simulate(args) -> int:
    """Nights of a spec on blocks, played on a scratch ledger and MLflow store: a line a night, then the
    blocks as the ledger holds them."""
    import datetime as dt

    spec = specs.load_spec(args.dataset)  # a bad spec fails here, in one line
    if args.nights < 1:
        return fail(f"--nights: {args.nights} must be at least 1")
    try:
        first = dt.date.fromisoformat(args.first) if args.first else None
    except ValueError:
        return fail(f"--first: {args.first!r} is not a date (YYYY-MM-DD)")
    # each night loads the last version (init: latest_registered): no progress bar a night
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from flows.reporting import shown
    from flows.simulate import simulate

    played = simulate(args.dataset, args.nights, first, Path(args.out) if args.out else None)
    print(f"\n{spec.name}: {args.nights} nights on {played['folder']}")
    print("| night | status | window | run epsilon | model epsilon |\n|---|---|---|---:|---:|")
    for night in played["nights"]:
        print(f"| {night.night} | {night.status} | {night.window} | "
              f"{'' if night.epsilon is None else shown(night.epsilon)} | "
              f"{'' if night.model_epsilon is None else shown(night.model_epsilon)} |")
    print("\n| block | charges | epsilon | lifetime |\n|---|---:|---:|---:|")
    for block in played["blocks"]:
        print(f"| {block.block} | {block.charges} | {shown(block.epsilon)} | {block.lifetime_epsilon:g} |")
    committed = sum(n.status == "committed" for n in played["nights"])
    print(f"\n{committed} of {args.nights} nights committed; the largest block's epsilon {shown(played['spent'])} of "
          f"its lifetime {played['lifetime']:g}")
    return 0
