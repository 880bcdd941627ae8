"""``privzo verify MODEL [VERSION]``: a registered version checked against the ledger and the run that trained
it; with --promote, the owner's alias."""
from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("verify", help="check a registered model version against the privacy ledger and the run "
                       "that trained it (epsilon, tags, description, and the weights of seeded estimators)")
    p.add_argument("model", metavar="MODEL", help="registered model name (the spec's name)")
    p.add_argument("version", metavar="VERSION", nargs="?", default=None, help="default: its latest version")
    p.add_argument("--tracking-uri", default=None,
                   help="MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    p.add_argument("--ledger", default=None,
                   help="SQLAlchemy URL of the ledger (default: $PRIVZO_LEDGER_URL, else the budget.ledger of the "
                        "run's spec)")
    p.add_argument("--promote", action="store_true", help="the ledger owner's: give a version that passes against the "
                   "team's ledger the alias 'verified' (consumers load models:/MODEL@verified); one that fails loses it")
    p.set_defaults(func=command)


def command(args) -> int:
    from flows.record.verify import verify_command

    return verify_command(args.model, args.version, tracking_uri=args.tracking_uri, ledger_url=args.ledger,
                          promote=args.promote)
