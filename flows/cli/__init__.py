"""``privzo`` command line: run, validate, calibrate, sweep, budget, audit, schema.

Validation imports only the spec layer, so a bad spec is reported in well under a second and nothing
(no MLflow run, no Prefect flow run, no file) is created.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

import specs
from flows.budget_command import budget_parsers
from flows.refusals import fail, is_refusal, refusal_line


# privzo runs offline: no usage telemetry from the libraries it drives. `privzo run` with no Prefect server
# starts Prefect's temporary one, whose 20 s start-up allowance is too short on a busy laptop or a 2-core CI
# box (the first run then fails before any work): 120 s. Set by the command, before Prefect or MLflow is
# imported; a team's worker has them from its stack (infra/local-stack.sh, infra/compose/Dockerfile).
COMMAND_ENVIRONMENT = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
}


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


def cmd_calibrate(args) -> int:
    spec = specs.load_spec(args.spec)
    from components import builders
    from components.families import family_for

    data = builders.load_data(spec, every_block=True)
    n = len(data.private)
    resolved, rate, eps = builders.plan(spec, data)
    _say_over_declared(spec)
    family = family_for(resolved)
    dimension = builders.model_dimension(resolved, data.n_features, data.n_classes) if family.needs_dimension else None
    for line in family.describe_plan(resolved, n, dimension):  # what the family's preset derived
        print(line)
    from components import memory_plan
    # peak memory against the device's, refused when over; the device's own line goes apart, on stderr: what
    # calibrate prints on stdout is the same for the same spec, whatever the machine has free at the moment
    memory_lines, machine_line = memory_plan.check_data(resolved, data)
    if resolved.privacy is None:
        print(f"mechanism none: no noise, not private ({resolved.optimizer.steps} steps)")
        print("\n".join(memory_lines))
        print(machine_line, file=sys.stderr)
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
    print(machine_line, file=sys.stderr)
    return 0


def _say_over_declared(spec: specs.RunSpec) -> None:
    """Blocks of the file over their declared size, on stderr of the data holder's own command (never in the
    run's logs or MLflow: the count is private)."""
    if spec.data.blocks is None:
        return
    from components.builders import source_table
    from flows.window import over_declared

    for line in over_declared(spec, source_table(spec)):
        print(line, file=sys.stderr)


def _preflight(spec: specs.RunSpec, resume: Optional[str]) -> None:
    """What ``calibrate`` checks, plus the model's shape and size and the checkpoint to resume, before
    Prefect starts: a spec that does not fit its data fails in one line, not after Prefect's task
    tracebacks. Costs one extra load of the data."""
    from components import builders
    from flows.checkpoints import resume_store

    data = builders.load_data(spec, every_block=True)
    builders.plan(spec, data)
    _say_over_declared(spec)
    builders.check_model(spec, data.n_features, data.n_classes,
                         os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    from components import memory_plan
    memory_plan.check_data(spec, data)  # the plan's peak against the device's memory
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
    if spec.tune is not None:  # as the private-train flow refuses it, before Prefect starts
        raise specs.SpecError("tune: this spec searches its hyperparameters; run it with privzo tune (the "
                              "private-tune flow), or remove its tune section to train it as written")
    # Prefect configures logging on import: before anything else logs (dp-accounting's absl would install
    # a plain root handler, and every Prefect line would print twice over in two formats)
    from flows.private_train import private_train
    from flows.tracking import EXPERIMENT_VIEW, run_url, ui_command

    _preflight(spec, args.resume)
    result = private_train(spec_path=str(args.spec), progress=not args.no_progress, resume=args.resume,
                           as_of=args.as_of)
    print()
    if result["before"]:  # a language model's zero-shot score through its prompt; any other's at its start
        start = "zero-shot" if getattr(spec.model, "prompt", None) is not None else "before training"
        print(_summary_line(f"{spec.name} {start}", result["before"]))
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


def _print_rehearsal(spec: specs.RunSpec, result) -> int:
    from flows.tracking import run_url

    print(f"{spec.name} rehearsal on {result['rows']}; nothing was charged (the private search would be "
          f"epsilon {result['private_search_epsilon']:.4g}, sigma {result['noise_multiplier']:.4g})")
    for row in result["settings"]:
        score = "failed" if row["score"] is None else f"{row['score']:.4f}"
        print(f"  {', '.join(f'{k} {v}' for k, v in row['setting'].items())}: {spec.tune.score.metric} {score}")
    if result["best"] is not None:
        print(f"best: {', '.join(f'{k} {v}' for k, v in result['best'].items())} ({result['score']:.4f})")
    link = run_url(result["tracking_uri"], result["experiment_id"], result["parent_run_id"])
    print(f"MLflow: the rehearsal's run {result['parent_run_id']}" + (f": {link}" if link else ""))
    return 0


def cmd_tune(args) -> int:
    spec = specs.load_spec(args.spec)  # fail fast, before Prefect or MLflow start
    missing = missing_packages(spec)
    if missing:
        raise specs.SpecError("; ".join(missing))
    if spec.tune is None:
        raise specs.SpecError("tune: this spec has no tune section; give tune.space and tune.candidates "
                              "(docs/guide/tuning.md), or train it with privzo run")
    from flows.tracking import run_url
    from flows.tune import private_tune

    result = private_tune(spec_path=str(args.spec), as_of=args.as_of)
    print()
    if result.get("rehearsal"):
        return _print_rehearsal(spec, result)
    if result["winner"] is None:
        print(f"{spec.name}: no candidate ran (K drew 0); nothing was released")
        return 0
    setting = ", ".join(f"{k} {v}" for k, v in result["winner"].items())
    print(f"{spec.name} winner ({setting}): {spec.tune.score.metric} {result['score']:.4f} on the "
          f"{spec.tune.score.split} rows")
    print(_summary_line(spec.name, result))
    print(f"privacy: {result['guarantee']}  (sigma {result['noise_multiplier']:.4g})")
    link = run_url(result["tracking_uri"], result["experiment_id"], result["run_id"])
    print(f"MLflow: the search's run {result['parent_run_id']}, the winner's child run {result['run_id']}"
          + (f": {link}" if link else ""))
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
    from reproduce.dpzero_quadratic import SPECTRA, spectra_of
    from reproduce.experiments import EXAMPLES

    experiments = spectra_of(args.experiments or list(SPECTRA))  # an unknown spectrum is refused before Prefect starts
    seeds = args.seeds if args.seeds is not None else [0]
    if any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise specs.SpecError("--seeds: distinct integers >= 0")
    uri = args.tracking_uri or specs.load_spec(EXAMPLES / "p1_o2nc_001.yaml").tracking.uri
    command = "privzo reproduce dpzero " + " ".join(
        ["--experiments", *experiments, "--seeds", *map(str, seeds)] + (["--quick"] if args.quick else []))
    out = args.out or "docs/results/dpzero_fig1.md"
    from reproduce.flow import reproduce_dpzero

    result = reproduce_dpzero(experiments=experiments, seeds=seeds, quick=args.quick, output=out, tracking_uri=uri,
                              experiment=args.experiment, command=command)
    print()
    print(result["table"], end="")
    print(f"MLflow parent run {result['parent_run_id']} ({result['seconds']:.0f} s); written to {out}")
    return 0


def cmd_reproduce(args) -> int:
    from reproduce.experiments import EXAMPLES, series_of

    if args.suite == "dpzero":
        return _reproduce_dpzero(args)
    if args.seeds is None:
        args.seeds = [0, 1, 2]
    kl = args.suite == "kl"
    experiments = args.experiments or (["E6", "E7", "E8", "E9"] if kl else ["E1", "E2", "E3", "E4", "E5"])
    if kl:
        from reproduce.kl_kernel import series_of as kl_series

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
        from reproduce.flow import reproduce_kl as run
    else:
        from reproduce.flow import reproduce_nonsmooth as run
    result = run(experiments=experiments, seeds=args.seeds, quick=args.quick, output=out, tracking_uri=uri,
                 experiment=args.experiment, command=command)
    print()
    print(result["table"], end="")
    print(f"MLflow parent run {result['parent_run_id']} ({result['seconds']:.0f} s); written to {out}")
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
        return fail(problem)
    if args.canaries is not None and args.canaries < 4:
        return fail(f"--canaries: {args.canaries} must be at least 4")
    if not 0.0 < args.confidence < 1.0:
        return fail(f"--confidence: {args.confidence} must be strictly between 0 and 1 (e.g. 0.95)")
    if not 0.0 <= args.noise_scale < float("inf"):
        return fail(f"--noise-scale: {args.noise_scale} must be a finite number >= 0")
    if args.threads is not None and args.threads < 1:
        return fail(f"--threads: {args.threads} must be at least 1")
    if args.person_rows is not None and (args.person_rows < 1 or not spec.person_level):
        return fail(f"--person-rows: {args.person_rows} must be at least 1" if spec.person_level else
                     "--person-rows: the spec is event level (no data.blocks.person); its canaries are rows")
    runs = default_runs(spec) if args.runs is None else args.runs
    problem = runs_problem(runs, args.canaries, args.guesses)
    if problem:
        return fail(problem)
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

    return verify_command(args.model, args.version, tracking_uri=args.tracking_uri, ledger_url=args.ledger,
                          promote=args.promote)


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
    p.add_argument("--as-of", metavar="TIME", default=None,
                   help="with data.blocks: the night whose window the run reads (ISO 8601, e.g. "
                   "2026-09-08T02:00:00+00:00; default now), as a deployment's scheduled time gives it")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("tune", help="choose a spec's hyperparameters inside its guarantee (its tune section): "
                       "a random number of candidates, only the best released")
    p.add_argument("spec")
    p.add_argument("--as-of", metavar="TIME", default=None,
                   help="with data.blocks: the night whose window the search reads (ISO 8601; default now)")
    p.set_defaults(func=cmd_tune)
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
    budget_parsers(sub.add_parser("budget", help="a dataset's privacy budget in the ledger: show | history "
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
                   help="SQLAlchemy URL of the ledger (default: $PRIVZO_LEDGER_URL, else the budget.ledger of the "
                        "run's spec)")
    p.add_argument("--promote", action="store_true", help="the ledger owner's: give a version that passes against the "
                   "team's ledger the alias 'verified' (consumers load models:/MODEL@verified); one that fails loses it")
    p.set_defaults(func=cmd_verify)
    p = sub.add_parser("schema", help="JSON Schema of RunSpec (for editors)")
    p.set_defaults(func=cmd_schema)
    args = parser.parse_args(argv)
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
            from flows.tracking import tool

            return fail(f"{str(err).splitlines()[0]}: {tool('privzo')} run {args.spec} --resume latest")
        raise
    except KeyboardInterrupt:
        return fail("interrupted", 130)


if __name__ == "__main__":
    sys.exit(main())
