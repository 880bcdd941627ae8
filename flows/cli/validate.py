"""``privzo validate SPEC``: the spec, its data's names and its memory plan checked; creates nothing (only the
spec layer is imported for a small model, so a bad spec is reported in well under a second)."""
from __future__ import annotations

from typing import List

import specs
from flows.cli.common import INSECURE, missing_packages


def add_parser(sub) -> None:
    p = sub.add_parser("validate", help="check a spec; creates nothing")
    p.add_argument("spec")
    p.set_defaults(func=command)


def command(args) -> int:
    spec = specs.load_spec(args.spec)
    # the data's names (files, header or schema, class folders), never a value: what `run` would refuse of them
    from components.data_check import source_problems  # standard library only: no torch

    split = spec.data.split
    prompt = getattr(spec.model, "prompt", None)  # label words: one per class of a text corpus, counted by name
    words = prompt.words if prompt is not None and prompt.kind == "label_words" else None
    problems = source_problems(spec.data.source, "data.source", split.column if split.kind == "column" else None,
                               spec.data.blocks, words=words)
    if split.kind == "source":
        problems += source_problems(split.public_source, "data.split.public_source")
    problems += missing_packages(spec)
    if problems:
        raise specs.SpecError("; ".join(problems))
    connected = _sql_checked(spec)
    from components import memory_plan  # a model sized by its config is planned here; torch only for such a model
    memory_plan.check_fits(spec)
    if spec.privacy is None:
        privacy = "NOT private (mechanism none)"
    elif spec.privacy.insecure_deterministic:
        privacy = f"{INSECURE}, nominal target epsilon {spec.privacy.epsilon}, accountant {spec.privacy.accountant}"
    else:
        privacy = f"target epsilon {spec.privacy.epsilon}, accountant {spec.privacy.accountant}"
    if spec.privacy is not None and spec.privacy.allow_large_delta:
        known = spec.data.declared_private_rows is not None  # else N is the private count, known once loaded
        if not known or spec.large_delta():
            privacy += (f", delta {spec.privacy.delta} {'is' if known else 'may be'} above 1/N "
                        "(privacy.allow_large_delta): not a meaningful guarantee")
    print(f"ok: {spec.name}: {spec.estimator.kind} on {spec.data.source.kind}:{spec.data.source.name}, {privacy}")
    for line in connected:
        print(line)
    if spec.tune is not None:
        _print_tune_plan(spec)
    if spec.budget is not None and (spec.data.blocks is None or spec.data.blocks.person is None) \
            and getattr(spec.data.source, "row_id", None) is None:
        # what the ledger can and cannot tell without an identifier (docs/design.md, Blocks: Laundering)
        print(f"note: budget.dataset {spec.budget.dataset!r} has no identifier (data.blocks.person or "
              "data.source.row_id), so the ledger tells its people from other datasets' by exact row content only: "
              "the same rows re-encoded (a column added, values rescaled or rounded, labels renamed) under another "
              "budget.dataset would get a second budget; where rows name a person or a record, declare that column")
    return 0


def _sql_checked(spec: specs.RunSpec) -> List[str]:
    """A table source checked where it lives (read-only: the catalogue and the public arrival column, never a
    feature or an id): the table, the columns, the identity types and how a window is read; a refusal, or
    the line that it could not connect and why (validate still checks the rest)."""
    if spec.data.source.kind != "sql":
        return []
    from components.data.sql import describe

    split = spec.data.split
    try:
        return describe(spec.data.source, blocks=spec.data.blocks,
                        public_flag=split.column if split.kind == "column" else None)
    except ValueError as err:
        if str(err).startswith("data.source.url:"):
            return [f"note: did not connect: {err}"]
        raise specs.SpecError(str(err)) from None


def _print_tune_plan(spec: specs.RunSpec) -> None:
    """The search's plan from the spec alone (N declared): K's law, each candidate's epsilon, the total."""
    if spec.privacy is None or not spec.private_count_is_public and spec.data.declared_private_rows is None:
        print("tune: the plan needs the private row count; privzo calibrate shows it")
        return
    if spec.private_count_is_public:  # replace-one: the count is read from the rows (privzo calibrate)
        print("tune: the plan depends on the private row count (replace_one); privzo calibrate shows it")
        return
    from components import builders
    from components.families import family_for

    resolved, _, _ = builders.resolve_privacy(spec)
    for line in family_for(resolved).describe_plan(resolved, None):
        print(line)
    if spec.tune.then != "train":  # a search's sigma depends on K's law: which is cheapest at this mean
        from components.tuning import law_lines

        for line in law_lines(spec, lambda varied: builders.resolve_privacy(varied)[0].mechanism.noise_multiplier):
            print(line)
