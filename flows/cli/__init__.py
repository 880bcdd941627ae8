"""``privzo`` command line: one module a subcommand, each owning its parser (``add_parser``) and its command;
this module builds the parser from them, sets the command's environment and prints a refusal in one line.

Validation imports only the spec layer, so a bad spec is reported in well under a second and nothing
(no MLflow run, no Prefect flow run, no file) is created.
"""
from __future__ import annotations

import argparse
import os
from typing import List, Optional

import specs
from flows.cli import audit, budget, calibrate, reproduce, run, schema, sweep, tune, validate, verify
from flows.cli.common import COMMAND_ENVIRONMENT, fail
from specs.refusal import is_refusal, refusal_line

__all__ = ["COMMAND_ENVIRONMENT", "main"]

SUBCOMMANDS = (run, tune, validate, calibrate, sweep, reproduce, budget, audit, verify, schema)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="privzo", description="Private zeroth-order training from one YAML spec.")
    sub = p.add_subparsers(dest="command", required=True)
    for subcommand in SUBCOMMANDS:
        subcommand.add_parser(sub)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
    for name, value in COMMAND_ENVIRONMENT.items():  # what the person exported wins
        os.environ.setdefault(name, value)
    try:
        return args.func(args)
    except specs.SpecError as err:
        return fail(str(err))
    except (ValueError, FileNotFoundError) as err:  # a spec that does not fit its data; nothing to resume
        return fail(refusal_line(err))
    except RuntimeError as err:
        if is_refusal(err):  # refusals, not crashes: one line
            return fail(refusal_line(err))
        from flows.private_train import cluster_lost

        if cluster_lost(err) and getattr(args, "spec", None):  # checkpointed, reservation kept: say how to go on
            from flows.record.tracking import tool

            return fail(f"{str(err).splitlines()[0]}: {tool('privzo')} run {args.spec} --resume latest")
        raise
    except KeyboardInterrupt:
        return fail("interrupted", 130)
