"""``privzo budget show DATASET`` (its blocks, what each spent, what a next run fits; ``--check`` recomputes
them) and ``privzo budget history DATASET`` (its charges, one a run): read from the ledger, never written."""
from __future__ import annotations

import os
import sys

import specs
from flows.cli.budget.parsing import action_parser
from flows.cli.common import fail
from flows.ledger.errors import shown_url

# what a reader looking for a dataset that is not there is told of where datasets come from
NOT_CHARGED = ("a dataset is in the ledger its runs name in budget.ledger, registered by its owner (privzo budget "
               "init) or by its first charged run; a run whose spec has no budget section is charged to no ledger")


def add_parsers(actions) -> None:
    a = action_parser(actions, "show", "the dataset", "DATASET", "a dataset's blocks, what each spent, what a next run "
                      "fits", show)
    a.add_argument("--spec", default=None, help="the spec of the runs on this dataset's blocks; adds the blocks its "
                   "next run reads and those retired for it")
    a.add_argument("--as-of", default=None, help="with --spec: the moment of that next run, ISO 8601 (default: now)")
    a.add_argument("--check", action="store_true", help="recompute every block's composition from its charges and "
                   "each committed charge against its plan; exit 1 naming any difference")
    action_parser(actions, "history", "the dataset", "DATASET", "a dataset's charges, one a run", history)


def show(args) -> int:
    return read_ledger(args, _show)


def history(args) -> int:
    return read_ledger(args, _history)


def read_ledger(args, action) -> int:
    """``action(args, ledger)`` on the ledger ``--ledger`` names, opened to read: a mistyped SQLite path is not
    created, and a database that cannot be read is refused in one line."""
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
        return fail(f"--ledger: no ledger at {args.ledger} (no file {url.database}): no run has been charged to it; "
                    f"{NOT_CHARGED}")
    try:
        return action(args, PrivacyLedger.open(args.ledger))
    except SQLAlchemyError as err:
        reason = getattr(err, "orig", None) or err  # the driver's own message, not SQLAlchemy's page of context
        where = url.render_as_string(hide_password=True)
        return fail(f"--ledger: cannot read {where} ({str(reason).splitlines()[0]})")


def _registered(args, ledger, with_window: bool):
    """The dataset's record and what of it is said before its charges: None once it has been said whole (not in
    the ledger, or registered and not yet charged)."""
    from flows.record.reporting import shown

    ds = ledger.dataset(args.dataset)
    if ds is None:
        known = ledger.datasets()
        where = ledger.engine.url.render_as_string(hide_password=True)  # a team ledger's URL may hold a password
        raise ValueError(f"DATASET: no dataset {args.dataset!r} in {where} "
                         f"({'known: ' + ', '.join(known) if known else 'it holds none yet'}); {NOT_CHARGED}")
    spec = _blocks_spec(args)
    window, refusal, states = _next_window(args, spec, ledger) if with_window else (None, None, {})
    if not ledger.history(args.dataset):  # registered by its owner (privzo budget init), not yet charged
        print(f"{args.dataset}: registered with lifetime epsilon {ds.lifetime_epsilon:g} at delta {shown(ds.delta, 3)} "
              f"({ds.accountant}, {ds.neighboring}); no run has been charged to it yet")
        if window is not None:
            print(f"the next run of {spec.name} (as of {window.as_of}) reads {len(window.blocks)} block"
                  f"{'s' if len(window.blocks) != 1 else ''}: {', '.join(window.blocks)}")
        return None
    return ds, spec, window, refusal, states


def _show(args, ledger) -> int:
    from flows.record.reporting import shown

    said = _registered(args, ledger, with_window=True)
    if said is None:
        return 0
    ds, spec, window, refusal, states = said
    spent = ledger.spent(args.dataset)
    blocks = ledger.blocks(args.dataset)
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
    for line in open_reservation_lines(args, ledger):
        print(line)
    return _checked(args, ledger) if args.check else 0


def open_reservation_lines(args, ledger) -> list:
    """One line per reservation still open: a run in progress (its lease live), a run that died (its lease
    ran out: what settles it, and the command), or one without a lease (an earlier privzo's: its resume)."""
    from flows.ledger.schema import utc_now

    found = ledger.open_reservations(args.dataset)
    if not found:
        return []
    now, lines = utc_now(), [f"{len(found)} open reservation{'s' if len(found) != 1 else ''}:"]
    for charge_id, run, created, until, bound, planned in found:
        head = f"  {charge_id} run {run!r}, reserved {created:%Y-%m-%d %H:%M:%S} UTC: "
        if until is None:
            lines.append(head + "no lease (reserved by an earlier privzo); it counts its planned run until its run is "
                         f"resumed: privzo run SPEC --resume latest")
        elif until >= now:
            lines.append(head + f"running, its lease renewed until {until:%H:%M:%S} UTC")
        else:
            at = ("released: it recorded no private query" if bound is None
                  else f"committed at its recorded bound, {bound} of {planned} steps")
            lines.append(head + f"its run died (lease ran out at {until:%Y-%m-%d %H:%M:%S} UTC); the next reservation "
                         f"on the dataset settles it ({at}), or now: privzo budget settle {args.dataset} "
                         f"--ledger {shown_url(args.ledger)}")
    return lines


def _history(args, ledger) -> int:
    from flows.record.reporting import shown

    said = _registered(args, ledger, with_window=False)
    if said is None:
        return 0
    ds = said[0]
    spent = ledger.spent(args.dataset)
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


def _blocks_spec(args):
    """--spec: the spec whose next run ``budget show`` describes (on blocks, charged to this dataset)."""
    if not getattr(args, "spec", None):
        return None
    spec = specs.load_spec(args.spec)
    if spec.budget is None:
        raise ValueError(f"--spec: {args.spec} has no budget section: its runs are not charged to a ledger")
    if spec.data.blocks is None:
        raise ValueError(f"--spec: {args.spec} reads no blocks (no data.blocks); give the spec of runs on blocks")
    if spec.budget.dataset != args.dataset:
        raise ValueError(f"--spec: {args.spec} charges dataset {spec.budget.dataset!r}, not {args.dataset!r}")
    return spec


def _next_window(args, spec, ledger):
    if spec is None:
        return None, None, {}
    import datetime as dt

    from flows.window import as_of_moment, next_window

    try:
        moment = as_of_moment(args.as_of)
    except ValueError as err:
        raise ValueError(f"--as-of: {str(err).split(': ', 1)[1]}") from None
    return next_window(spec, moment.astimezone(dt.timezone.utc), ledger)  # the ledger --ledger names
