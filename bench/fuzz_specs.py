"""Spec fuzzing at scale: 10,000 random and mutated specs, each valid or refused in one line, none a traceback.

The generators and the property are tests/specs/test_spec_fuzz.py's (mutated examples, JSON-like trees, YAML
oddities; a refusal is privzo's SpecError on one line naming a field, in at most 300 characters and never in
pydantic's words, "instance of DataSpec" and the like). Each case goes through
``specs.spec_from_dict`` (trees) and ``specs.load_spec`` on a written file; every ``--cli-every``-th case
also through ``privzo validate`` with HOME and the working directory in an empty folder, which must stay
empty (no MLflow store, ledger, checkpoint or .privzo folder).

    python bench/fuzz_specs.py                  # 10,000 cases
    python bench/fuzz_specs.py --cases 200      # a quick look
    python bench/fuzz_specs.py --seed 7         # another draw (the default seed repeats the same cases)

Prints, per generator, how many cases were valid, rejected and tracebacks (any exception but SpecError, or
a refusal that breaks the property), the CLI sample's counts, the refusal messages' wording figures (how many
name a pydantic class or run over 300 characters, the longest), and the time; exits 1 on any traceback,
printing the first few with their case.
"""
from __future__ import annotations

import argparse
import reprlib
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

import tests.specs.test_spec_fuzz as fuzz_tests  # noqa: E402
from tests.specs.test_spec_fuzz import GENERATORS, Case, run_case  # noqa: E402

# a refusal in privzo's words names the section and what it must be, never pydantic's model classes, in at
# most SHORT characters (after the file's name); check_refusal holds each case to both
PYDANTIC_WORDS, SHORT = fuzz_tests.PYDANTIC_WORDS, fuzz_tests.MAX_MESSAGE
MESSAGES: List[str] = []

SHOWN = reprlib.Repr()
SHOWN.maxstring = SHOWN.maxother = 300
SHOWN.maxlevel, SHOWN.maxlist, SHOWN.maxdict = 4, 8, 16


def describe(case: Case) -> str:
    try:
        return SHOWN.repr(case.tree if case.text is None else case.text)
    except (ValueError, RecursionError):  # an integer of thousands of digits has no repr
        return f"<{case.source}: cannot be shown>"


def fuzz(n_cases: int, cli_every: int, draw_seed: int) -> Tuple[Dict[str, Counter], Counter, List[str], int]:
    """Runs the cases, a third from each generator; returns per-generator counts, the CLI sample's counts,
    the tracebacks and the number of cases run."""
    by_source: Dict[str, Counter] = {}
    cli: Counter = Counter()
    failures: List[str] = []
    ran = 0
    checked = fuzz_tests.check_refusal

    def recording(err, data=None, origin=None) -> str:  # every refusal's message, for its wording figures
        message = checked(err, data, origin)
        MESSAGES.append(message)
        return message

    fuzz_tests.check_refusal = recording

    def one(case: Case) -> None:
        nonlocal ran
        ran += 1
        counts = by_source.setdefault(case.source, Counter())
        with tempfile.TemporaryDirectory(prefix="privzo-fuzz-") as folder:
            try:
                results = run_case(case, Path(folder), cli=ran % cli_every == 0)
            except Exception:  # a crash, or a refusal that is not one line naming a field: the bugs looked for
                counts["tracebacks"] += 1
                failures.append(f"case {ran} ({case.source}): {describe(case)}\n{traceback.format_exc()}")
                return
        # a tree's own outcome is spec_from_dict's (its YAML file may differ: paths are anchored to the folder)
        counts[results.get("spec_from_dict", results.get("load_spec", "rejected"))] += 1
        if "cli" in results:
            cli[results["cli"]] += 1

    for i, strategy in enumerate(GENERATORS.values()):
        share = n_cases // len(GENERATORS) + (i < n_cases % len(GENERATORS))
        if share:
            # generate only: no shrinking (nothing fails inside one), no example database
            run = settings(max_examples=share, phases=[Phase.generate], database=None, deadline=None,
                           suppress_health_check=list(HealthCheck))(given(case=strategy)(one))
            seed(draw_seed + i)(run)()
    return by_source, cli, failures, ran


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--cli-every", type=int, default=25, help="run `privzo validate` on every n-th case")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed of the draw")
    parser.add_argument("--show", type=int, default=3, help="tracebacks to print")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    by_source, cli, failures, ran = fuzz(args.cases, args.cli_every, args.seed)
    seconds = time.perf_counter() - start

    print(f"{'generator':18} {'cases':>7} {'valid':>7} {'rejected':>9} {'tracebacks':>11}")
    total: Counter = Counter()
    for source, counts in sorted(by_source.items()):
        n = sum(counts.values())
        total.update(counts)
        print(f"{source:18} {n:7d} {counts['valid']:7d} {counts['rejected']:9d} {counts['tracebacks']:11d}")
    print(f"{'total':18} {ran:7d} {total['valid']:7d} {total['rejected']:9d} {total['tracebacks']:11d}")
    print(f"privzo validate on {sum(cli.values())} of them (HOME and cwd an empty folder, left empty): "
          f"{cli['valid']} valid, {cli['rejected']} rejected")
    worded = sum(bool(PYDANTIC_WORDS.search(m)) for m in MESSAGES)
    long = sum(len(m) > SHORT for m in MESSAGES)
    print(f"refusal messages: {len(MESSAGES)}; naming a pydantic class: {worded}; over {SHORT} characters: {long}; "
          f"the longest: {max(map(len, MESSAGES), default=0)}")
    for message in [m for m in MESSAGES if PYDANTIC_WORDS.search(m) or len(m) > SHORT][:args.show]:
        print(f"  e.g. {message[:400]}")
    print(f"time {seconds:.1f} s ({1000 * seconds / max(ran, 1):.1f} ms a case), seed {args.seed}")
    for failure in failures[:args.show]:
        print("\n" + failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
