"""``privzo sweep SPEC...``: every spec at every epsilon and seed, tabled in each spec's own metrics."""
from __future__ import annotations

from typing import List

import specs
from flows.cli.common import missing_packages


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="run specs across epsilons and seeds; table + privacy-utility plot")
    p.add_argument("specs", nargs="+")
    p.add_argument("--epsilons", nargs="+", type=float, default=[0.1, 0.5, 1.0, 2.0, 3.0])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--tracking-uri", default=None, help="default: the first spec's tracking.uri")
    p.add_argument("--experiment", default="privzo-sweep")
    p.add_argument("--out", default=None, help="write the markdown table here (plus .csv and .png beside it); the "
                   "table and CSV are rewritten after every finished cell")
    p.set_defaults(func=command)


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


def command(args) -> int:
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
