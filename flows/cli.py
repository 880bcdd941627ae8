"""``privzo`` command line: run, validate, calibrate, sweep, budget, audit, schema.

Validation imports only the spec layer, so a bad spec is reported in well under a second and nothing
(no MLflow run, no Prefect flow run, no file) is created.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import List, Optional

import specs
from flows.refusals import is_refusal, refusal_line
from specs.sections import LEDGER_URL_ENV, ledger_from_env


def _fail(message: str, code: int = 2) -> int:
    print(f"privzo: error: {message}", file=sys.stderr)
    return code


# insecure_deterministic: the epsilon a spec names is nominal, and every output that shows it says so
INSECURE = ("NOT private (privacy.insecure_deterministic: noise and batches come from the public seed; "
            "the nominal epsilon does not hold)")


def missing_packages(spec) -> List[str]:
    """One line for each package the run would load a named dataset, model or adapter from and that is not
    installed (found without importing anything)."""
    from components.data_check import package_missing
    from components.pretrained import PRETRAINED  # no torch
    sources = [("data.source", spec.data.source)]
    if spec.data.split.kind == "source":
        sources.append(("data.split.public_source", spec.data.split.public_source))
    parts = [(source.name, f"{field}.name") for field, source in sources if source.kind in ("text", "packaged_images")]
    parts += [(source.tokenizer, f"{field}.tokenizer") for field, source in sources
              if source.kind == "text" and source.tokenizer in PRETRAINED]
    model = spec.model
    if model.kind == "hf":
        parts.append(("hf", "model.kind"))
        if model.name is not None:
            parts.append((model.name, "model.name"))
        if model.trainable == "lora":
            parts.append(("lora", "model.trainable"))
    return [line for line in (package_missing(*part) for part in dict.fromkeys(parts)) if line]


def cmd_validate(args) -> int:
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
    from components import memory  # a model sized by its config is planned here; torch only for such a model
    memory.check_fits(spec)
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
    if spec.budget is not None and (spec.data.blocks is None or spec.data.blocks.person is None) \
            and getattr(spec.data.source, "row_id", None) is None:
        # what the ledger can and cannot tell without an identifier (docs/design.md, Blocks: Laundering)
        print(f"note: budget.dataset {spec.budget.dataset!r} has no identifier (data.blocks.person or "
              "data.source.row_id), so the ledger tells its people from other datasets' by exact row content only: "
              "the same rows re-encoded (a column added, values rescaled or rounded, labels renamed) under another "
              "budget.dataset would get a second budget; where rows name a person or a record, declare that column")
    return 0


def cmd_calibrate(args) -> int:
    spec = specs.load_spec(args.spec)
    from components import builders
    from components.families import family_for

    data = builders.load_data(spec, every_block=True)
    n = len(data.private)
    resolved, rate, eps = builders.plan(spec, data)
    family = family_for(resolved)
    dimension = builders.model_dimension(resolved, data.n_features, data.n_classes) if family.needs_dimension else None
    for line in family.describe_plan(resolved, n, dimension):  # what the family's preset derived
        print(line)
    from components import memory
    memory_lines = memory.check_data(resolved, data)  # peak memory against the device's, refused when over
    if resolved.privacy is None:
        print(f"mechanism none: no noise, not private ({resolved.optimizer.steps} steps)")
        print("\n".join(memory_lines))
        return 0
    sigma = float(resolved.mechanism.noise_multiplier)
    nominal = "" if resolved.private else "  NOT private: nominal only"
    if not resolved.private:
        print(f"privacy:                  {INSECURE}")
    print(f"noise_multiplier (sigma): {sigma:.6g}")
    print(f"steps:                    {resolved.optimizer.steps}")
    print(f"sampling rate:            {rate:.6g}  ({builders.spec_sampler(resolved, n).describe()})")
    print(f"epsilon:                  {eps:.6g}  (target {resolved.privacy.epsilon}, accountant "
          f"{resolved.privacy.accountant}){nominal}")
    large = (f"  above 1/N = 1/{resolved.public_rows(n)} (privacy.allow_large_delta): NOT a meaningful guarantee"
             if resolved.large_delta(n) else "")
    print(f"delta:                    {float(resolved.privacy.delta):.6g}{nominal}{large}")
    if resolved.privacy.accountant == "zcdp":
        rho = builders.accountant(resolved).rho(builders.planned_event(resolved, n, sigma))
        print(f"zCDP rho:                 {rho:.6g}{nominal}")
    print("\n".join(memory_lines))
    return 0


def _preflight(spec: specs.RunSpec, resume: Optional[str]) -> None:
    """What ``calibrate`` checks, plus the model's shape and size and the checkpoint to resume, before
    Prefect starts: a spec that does not fit its data fails in one line, not after Prefect's task
    tracebacks. Costs one extra load of the data."""
    from components import builders
    from flows.checkpoints import resume_store

    data = builders.load_data(spec, every_block=True)
    builders.plan(spec, data)
    builders.check_model(spec, data.n_features, data.n_classes,
                         os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    from components import memory
    memory.check_data(spec, data)  # the plan's peak against the device's memory
    resume_store(spec.checkpoint.dir, spec.name, resume)


def _summary_line(name: str, result: dict) -> str:
    """The run's headline in the metrics its evaluation returned (``eval/*``): a classifier's test accuracy
    and loss; a synthetic objective's excess risk, with O2NC's Goldstein certificate or a KL problem's
    gradient norm, and the test loss where the problem has test rows (flows.sweep.METRICS names them)."""
    if "eval/accuracy" in result:
        return f"{name}: test accuracy {result['eval/accuracy']:.4f}, test loss {result['eval/loss']:.4f}"
    from flows.sweep import METRICS, headline

    evaluated = {k.split("/", 1)[1]: v for k, v in result.items() if k.startswith("eval/")}
    # 4 significant digits, not 4 decimals: an excess risk near the noise floor is far below 1e-4
    parts = [f"{METRICS[m].label} {evaluated[m]:.4g}" for m in headline(evaluated)]
    if "loss" in evaluated:
        parts.append(f"test loss {evaluated['loss']:.4g}")
    if not parts:  # a metric no row of METRICS names yet: show what was evaluated rather than nothing
        parts = [f"{k} {v:.4g}" for k, v in evaluated.items()]
    return f"{name}: " + ", ".join(parts)


def cmd_run(args) -> int:
    spec = specs.load_spec(args.spec)  # fail fast, before Prefect or MLflow start
    missing = missing_packages(spec)
    if missing:
        raise specs.SpecError("; ".join(missing))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Prefect configures logging on import: before anything else logs (dp-accounting's absl would install
    # a plain root handler, and every Prefect line would print twice over in two formats)
    from flows.private_train import private_train
    from flows.tracking import EXPERIMENT_VIEW, run_url, ui_command

    _preflight(spec, args.resume)
    result = private_train(spec_path=str(args.spec), progress=not args.no_progress, resume=args.resume)
    print()
    print(_summary_line(spec.name, result))
    if spec.privacy is None:
        print(f"privacy: {result['guarantee']}")
    else:
        if result["model_guarantee"] != result["guarantee"]:
            print(f"model {spec.name} version {result['model_version']}: {result['model_guarantee']}")
        print(f"{'this run spent' if result['model_guarantee'] != result['guarantee'] else 'privacy'}: "
              f"{result['guarantee']}  (target epsilon {result['target_epsilon']}, "
              f"sigma {result['noise_multiplier']:.4g}, {result['steps']} steps)")
    uri = result["tracking_uri"]
    link = run_url(uri, result["experiment_id"], result["run_id"])
    if link:
        print(f"MLflow run {result['run_name']}: {link}")
    else:
        print(f"MLflow run {result['run_name']} ({result['run_id']}) in {uri}")
        print(f"open the UI with: {ui_command(uri)}  (then http://127.0.0.1:5000/#/experiments/"
              f"{result['experiment_id']}{EXPERIMENT_VIEW})")
    return 0


def _sweep_preflight(loaded: List[specs.RunSpec], epsilons: List[float], seeds: List[int]) -> None:
    """Every cell planned as its run will plan it, before Prefect starts: a cell its data cannot carry (a KL
    preset whose noise floor at a small epsilon is above the initial gap, a batch larger than the private
    rows) is refused in one line naming the spec and epsilon, not after the cells before it have run.
    Costs one load of each spec's data and one calibration a cell (seconds)."""
    from components import builders

    for spec in loaded:
        missing = missing_packages(spec)
        if missing:
            raise specs.SpecError(f"sweep: {spec.name}: {'; '.join(missing)}")
        data = builders.load_data(spec)
        for eps in epsilons if spec.privacy is not None else [None]:
            cell = spec.model_dump(mode="json")
            cell["seed"] = seeds[0]  # planned as the first cell of this spec and epsilon will be
            if eps is not None:
                cell["privacy"]["epsilon"] = eps
            try:
                builders.plan(specs.spec_from_dict(cell), data)
            except (ValueError, specs.SpecError) as err:
                at = "" if eps is None else f" at epsilon {eps:g}"
                raise specs.SpecError(f"sweep: {spec.name} cannot run{at}: {str(err).splitlines()[0]}; sweep it "
                                      f"at epsilons whose plan fits (privzo calibrate shows a spec's plan)") from None


def cmd_sweep(args) -> int:
    """Every spec at every epsilon and seed. Each spec is reported in its own headline metrics: accuracy for a
    classifier, excess risk plus the Goldstein certificate (O2NC) or the gradient norm (KL) for a synthetic
    objective. A mixed sweep (classifiers with objectives) runs and prints one table per metric, each listing
    the specs that have it; a sweep of classifiers prints the single accuracy table."""
    from flows.sweep import argument_problem, refusal, sweep

    loaded = []
    for path in args.specs:
        spec = specs.load_spec(path)  # fail fast on any bad spec, before Prefect starts
        problem = refusal(spec)
        if problem:
            raise specs.SpecError(problem)
        loaded.append(spec)
    problem = argument_problem(args.epsilons, args.seeds, args.out)
    if problem:
        raise specs.SpecError(problem)
    _sweep_preflight(loaded, args.epsilons, args.seeds)

    result = sweep(spec_paths=[str(p) for p in args.specs], epsilons=args.epsilons, seeds=args.seeds,
                   tracking_uri=args.tracking_uri, experiment=args.experiment, output=args.out)
    print()
    print(result["table"], end="")
    print(f"MLflow parent run {result['parent_run_id']}" + (f"; table written to {args.out}" if args.out else ""))
    return 0


def _reproduce_dpzero(args) -> int:
    from components.reproduce.dpzero_quadratic import SPECTRA, spectra_of
    from components.reproduce.experiments import EXAMPLES

    experiments = spectra_of(args.experiments or list(SPECTRA))  # an unknown spectrum is refused before Prefect starts
    seeds = args.seeds if args.seeds is not None else [0]
    if any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise specs.SpecError("--seeds: distinct integers >= 0")
    uri = args.tracking_uri or specs.load_spec(EXAMPLES / "p1_o2nc_001.yaml").tracking.uri
    command = "privzo reproduce dpzero " + " ".join(
        ["--experiments", *experiments, "--seeds", *map(str, seeds)] + (["--quick"] if args.quick else []))
    out = args.out or "docs/results/dpzero_fig1.md"
    from flows.reproduce import reproduce_dpzero

    result = reproduce_dpzero(experiments=experiments, seeds=seeds, quick=args.quick, output=out, tracking_uri=uri,
                              experiment=args.experiment, command=command)
    print()
    print(result["table"], end="")
    print(f"MLflow parent run {result['parent_run_id']} ({result['seconds']:.0f} s); written to {out}")
    return 0


def cmd_reproduce(args) -> int:
    from components.reproduce.experiments import EXAMPLES, series_of

    if args.suite == "dpzero":
        return _reproduce_dpzero(args)
    if args.seeds is None:
        args.seeds = [0, 1, 2]
    kl = args.suite == "kl"
    experiments = args.experiments or (["E6", "E7", "E8", "E9"] if kl else ["E1", "E2", "E3", "E4", "E5"])
    if kl:
        from components.reproduce.kl_kernel import series_of as kl_series

        kl_series(experiments, args.quick)  # an unknown experiment is refused before Prefect starts
    else:
        series_of(experiments, args.quick)
    if any(s < 0 for s in args.seeds) or len(set(args.seeds)) != len(args.seeds):
        raise specs.SpecError("--seeds: distinct integers >= 0")
    uri = args.tracking_uri or specs.load_spec(EXAMPLES / "p1_o2nc_001.yaml").tracking.uri
    command = f"privzo reproduce {args.suite} " + " ".join(
        ["--experiments", *experiments, "--seeds", *map(str, args.seeds)] + (["--quick"] if args.quick else []))
    out = args.out or f"docs/results/{'kl' if kl else 'nonsmooth'}_rates.md"
    if kl:
        from flows.reproduce import reproduce_kl as run
    else:
        from flows.reproduce import reproduce_nonsmooth as run
    result = run(experiments=experiments, seeds=args.seeds, quick=args.quick, output=out, tracking_uri=uri,
                 experiment=args.experiment, command=command)
    print()
    print(result["table"], end="")
    print(f"MLflow parent run {result['parent_run_id']} ({result['seconds']:.0f} s); written to {out}")
    return 0


def cmd_budget(args) -> int:
    if args.action == "simulate":
        return cmd_simulate(args)
    if args.action in ("init", "grant"):
        return cmd_budget_owner(args)
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    from flows.ledger import PrivacyLedger

    try:
        url = make_url(args.ledger)
    except ArgumentError:
        return _fail(f"--ledger: {args.ledger!r} is not a database URL; e.g. sqlite:////ABSOLUTE/PATH.db or "
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
        return _fail(f"--ledger: cannot read {where} ({str(reason).splitlines()[0]})")


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
            return _fail(f"--ledger: this role may not register datasets in {where}; a dataset's lifetime is set "
                         "with the ledger owner's credentials")
        new = ledger.register(terms)
    except SQLAlchemyError as err:
        return _fail(f"--ledger: {where}: {driver_reason(err)}")
    print(f"{terms.dataset}: {'registered' if new else 'already registered'} in {where} with lifetime epsilon "
          f"{terms.lifetime_epsilon:g} at delta {terms.delta:g} ({terms.accountant}, {terms.neighboring}), "
          f"{terms.described()}; runs charged to it are admitted within that, each block's own with data.blocks, "
          "and a run whose spec has other terms is refused")
    return 0


def cmd_simulate(args) -> int:
    """Nights of a spec on blocks, played on a scratch ledger and MLflow store: a line a night, then the
    blocks as the ledger holds them."""
    import datetime as dt

    spec = specs.load_spec(args.dataset)  # a bad spec fails here, in one line
    if args.nights < 1:
        return _fail(f"--nights: {args.nights} must be at least 1")
    try:
        first = dt.date.fromisoformat(args.first) if args.first else None
    except ValueError:
        return _fail(f"--first: {args.first!r} is not a date (YYYY-MM-DD)")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
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

    from flows.blocks import as_of_moment, next_window

    try:
        moment = as_of_moment(args.as_of)
    except ValueError as err:
        raise ValueError(f"--as-of: {str(err).split(': ', 1)[1]}") from None
    return next_window(spec.model_copy(update={"budget": spec.budget.model_copy(update={"ledger": args.ledger})}),
                       moment.astimezone(dt.timezone.utc))


def _checked(args, ledger) -> int:
    """``budget show --check``: the ledger's record recomputed from its charges; 1, naming each difference."""
    from flows.ledger import ledger_problems

    problems = ledger_problems(ledger, args.dataset)
    for problem in problems:
        print(f"check: {problem}", file=sys.stderr)
    if not problems:
        print(f"check: every committed charge of {args.dataset} executed its plan, and every block's stored "
              "composition is what its committed charges compose to")
    return 1 if problems else 0


def _budget_parsers(p) -> None:
    """``privzo budget``'s actions, each with its own arguments."""
    actions = p.add_subparsers(dest="action", required=True, metavar="{show,history,simulate,init,grant}")

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


def cmd_audit(args) -> int:
    spec = specs.load_spec(args.spec)  # fail fast, before Prefect or MLflow start
    missing = missing_packages(spec)
    if missing:
        raise specs.SpecError("; ".join(missing))
    from components.audit import audit_problem, default_runs, runs_problem, with_epsilon

    if args.epsilon is not None:
        spec = with_epsilon(spec, args.epsilon)  # a bad epsilon is refused here, in one line

    problem = audit_problem(spec)
    if problem:
        return _fail(problem)
    if args.canaries is not None and args.canaries < 4:
        return _fail(f"--canaries: {args.canaries} must be at least 4")
    if not 0.0 < args.confidence < 1.0:
        return _fail(f"--confidence: {args.confidence} must be strictly between 0 and 1 (e.g. 0.95)")
    if not 0.0 <= args.noise_scale < float("inf"):
        return _fail(f"--noise-scale: {args.noise_scale} must be a finite number >= 0")
    if args.threads is not None and args.threads < 1:
        return _fail(f"--threads: {args.threads} must be at least 1")
    if args.person_rows is not None and (args.person_rows < 1 or not spec.person_level):
        return _fail(f"--person-rows: {args.person_rows} must be at least 1" if spec.person_level else
                     "--person-rows: the spec is event level (no data.blocks.person); its canaries are rows")
    runs = default_runs(spec) if args.runs is None else args.runs
    problem = runs_problem(runs, args.canaries, args.guesses)
    if problem:
        return _fail(problem)
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from flows.audit import privacy_audit

    result = privacy_audit(spec_path=str(args.spec), canaries=args.canaries, confidence=args.confidence,
                           background=args.background, noise_scale=args.noise_scale, guesses=args.guesses,
                           tracking_uri=args.tracking_uri, experiment=args.experiment, log=not args.no_log,
                           threads=args.threads, epsilon=args.epsilon, runs=runs, person_rows=args.person_rows)
    print()
    print(result["report"], end="")
    if "run_id" in result:
        print(f"MLflow run {result['run_id']} in {result['tracking_uri']}")
    return 0


def cmd_verify(args) -> int:
    from flows.verify import verify_command

    return verify_command(args.model, args.version, tracking_uri=args.tracking_uri, ledger_url=args.ledger)


def cmd_schema(_args) -> int:
    print(specs.json_schema())
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="privzo", description="Private zeroth-order training from one YAML spec.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run a spec as a Prefect flow, tracked in MLflow")
    p.add_argument("spec")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--resume", metavar="KEY", default=None,
                   help="resume a killed run from its last checkpoint: its run key (printed at start) or 'latest'")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("validate", help="check a spec; creates nothing")
    p.add_argument("spec")
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser("calibrate", help="print sigma, steps, sampling rate and epsilon for a spec")
    p.add_argument("spec")
    p.set_defaults(func=cmd_calibrate)
    p = sub.add_parser("sweep", help="run specs across epsilons and seeds; table + privacy-utility plot")
    p.add_argument("specs", nargs="+")
    p.add_argument("--epsilons", nargs="+", type=float, default=[0.1, 0.5, 1.0, 2.0, 3.0])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--tracking-uri", default=None, help="default: the first spec's tracking.uri")
    p.add_argument("--experiment", default="privzo-sweep")
    p.add_argument("--out", default=None, help="write the markdown table here (plus .csv and .png beside it); the "
                   "table and CSV are rewritten after every finished cell")
    p.set_defaults(func=cmd_sweep)
    p = sub.add_parser("reproduce", help="the papers' rate experiments (nonsmooth: E1 to E5 of the two nonsmooth papers; kl: E6 "
                       "to E9 of the KL paper (Menart et al.); dpzero: Figure 1 of DPZero)")
    p.add_argument("suite", choices=["nonsmooth", "kl", "dpzero"])
    p.add_argument("--experiments", nargs="+", default=None, help="default: all of the suite's (dpzero: the spectra "
                   "identity, inverse_sqrt, inverse)")
    p.add_argument("--seeds", nargs="+", type=int, default=None, help="default: 0 1 2 (dpzero: 0)")
    p.add_argument("--quick", action="store_true", help="tiny grids through the same code (a smoke run)")
    p.add_argument("--out", default=None, help="the markdown table (the CSV and one PNG per experiment are written "
                   "beside it; default docs/results/<suite>_rates.md, dpzero: docs/results/dpzero_fig1.md)")
    p.add_argument("--tracking-uri", default=None, help="default: the example specs' tracking.uri")
    p.add_argument("--experiment", default="privzo-reproduce", help="MLflow experiment")
    p.set_defaults(func=cmd_reproduce)
    _budget_parsers(sub.add_parser("budget", help="a dataset's privacy budget in the ledger: show | history "
                                   "DATASET; simulate SPEC plays nights of a spec on blocks on a scratch ledger; "
                                   "the ledger owner's: init DATASET registers its lifetime, grant ROLE"))
    p = sub.add_parser("audit", help="empirical lower bound on a spec's epsilon (canaries in one or many training runs)")
    p.add_argument("spec")
    p.add_argument("--canaries", type=int, default=None,
                   help="canary slots, each included with probability 1/2 (default: 1000 for d-dimensional "
                        "releases, rate x steps x queries / 4 within 100..1000 for scalar ones)")
    p.add_argument("--epsilon", type=float, default=None, help="audit at this privacy.epsilon (default: the spec's)")
    p.add_argument("--confidence", type=float, default=0.95, help="confidence of the lower bound (default 0.95)")
    p.add_argument("--background", choices=["none", "public"], default="none",
                   help="rows present besides the canaries: none (the worst case) or the spec's public rows")
    p.add_argument("--guesses", type=int, default=None, help="number of guesses (default: chosen without the truth)")
    p.add_argument("--runs", type=int, default=None,
                   help="1: one training run with many canaries; K >= 10: K runs of one canary each, "
                        "Clopper-Pearson (default: 1, and 100 for PAZO-S and the KL optimizers, whose one run "
                        "cannot tell canaries apart)")
    p.add_argument("--noise-scale", type=float, default=1.0,
                   help="self-test: multiply the noise by this while claiming the calibrated epsilon (0: no noise)")
    p.add_argument("--person-rows", type=int, default=None,
                   help="a person-level spec: rows of each canary person (default 2; more rows test the clipping "
                        "of a person's sum harder)")
    p.add_argument("--tracking-uri", default=None, help="default: the spec's tracking.uri")
    p.add_argument("--experiment", default=None, help="default: the spec's experiment (its name)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: execution.threads, else 1)")
    p.add_argument("--no-log", action="store_true", help="print the report only; no MLflow run")
    p.set_defaults(func=cmd_audit)
    p = sub.add_parser("verify", help="check a registered model version against the privacy ledger and the run "
                       "that trained it (epsilon, tags, description, and the weights of seeded estimators)")
    p.add_argument("model", metavar="MODEL", help="registered model name (the spec's name)")
    p.add_argument("version", metavar="VERSION", nargs="?", default=None, help="default: its latest version")
    p.add_argument("--tracking-uri", default=None,
                   help="MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    p.add_argument("--ledger", default=None,
                   help="SQLAlchemy URL of the ledger (default: the budget.ledger of the run's spec)")
    p.set_defaults(func=cmd_verify)
    p = sub.add_parser("schema", help="JSON Schema of RunSpec (for editors)")
    p.set_defaults(func=cmd_schema)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except specs.SpecError as err:
        return _fail(str(err))
    except (ValueError, FileNotFoundError) as err:  # a spec that does not fit its data; nothing to resume
        return _fail(refusal_line(err))
    except RuntimeError as err:
        if is_refusal(err):  # refusals, not crashes: one line
            return _fail(refusal_line(err))
        from flows.private_train import cluster_lost

        if cluster_lost(err) and getattr(args, "spec", None):  # checkpointed, reservation kept: say how to go on
            from flows.tracking import tool

            return _fail(f"{str(err).splitlines()[0]}: {tool('privzo')} run {args.spec} --resume latest")
        raise
    except KeyboardInterrupt:
        return _fail("interrupted", 130)


if __name__ == "__main__":
    sys.exit(main())
