"""``privzo reproduce SUITE``: the papers' rate experiments (nonsmooth, kl) and DPZero's Figure 1 (dpzero)."""
from __future__ import annotations

import specs


def add_parser(sub) -> None:
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
    p.set_defaults(func=command)


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


def command(args) -> int:
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
