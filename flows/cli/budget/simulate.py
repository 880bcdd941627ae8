"""``privzo budget simulate SPEC``: nights of a spec on blocks played on a scratch ledger and MLflow store."""
from __future__ import annotations

import os
from pathlib import Path

import specs
from flows.cli.budget.parsing import action_parser
from flows.cli.common import fail


def add_parsers(actions) -> None:
    a = action_parser(actions, "simulate", "a spec on blocks", "SPEC", "play nights of a spec on blocks on a scratch "
                      "ledger", simulate, ledger=False)
    a.add_argument("--nights", type=int, default=60, help="how many nights (default 60)")
    a.add_argument("--first", default=None, help="the first night, YYYY-MM-DD (default: the first whose window is "
                   "full)")
    a.add_argument("--out", default=None, help="the folder for its ledger, MLflow store and stream (default: a new "
                   "temporary folder)")


def simulate(args) -> int:
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
    from flows.record.reporting import shown
    from flows.simulate import simulate as play

    played = play(args.dataset, args.nights, first, Path(args.out) if args.out else None)
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
