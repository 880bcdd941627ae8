"""``privzo audit SPEC``: an empirical lower bound on a spec's epsilon, from canaries."""
from __future__ import annotations

from flows.cli.common import fail, installed_spec


def add_parser(sub) -> None:
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
    p.set_defaults(func=command)


def command(args) -> int:
    spec = installed_spec(args.spec)  # fail fast, before Prefect or MLflow start
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
