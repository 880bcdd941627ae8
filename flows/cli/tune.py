"""``privzo tune SPEC``: the private search of a spec's tune section (or its rehearsal on public rows)."""
from __future__ import annotations

import specs
from flows.cli.common import installed_spec, summary_line


def add_parser(sub) -> None:
    p = sub.add_parser("tune", help="choose a spec's hyperparameters inside its guarantee (its tune section): "
                       "a random number of candidates, only the best released")
    p.add_argument("spec")
    p.add_argument("--as-of", metavar="TIME", default=None,
                   help="with data.blocks: the night whose window the search reads (ISO 8601; default now)")
    p.set_defaults(func=command)


def _print_rehearsal(spec: specs.RunSpec, result) -> None:
    """The rehearsal's table (every setting, best first), how it ranked them, and what to run next."""
    from components.tuning import RepeatLaw
    from flows.record.tracking import run_url

    tune = spec.tune
    print(f"{spec.name} rehearsal on {result['rows']}; nothing was charged")
    metrics = [m for m in ("accuracy", "loss") if any(row["scores"] and m in row["scores"] for row in result["ranked"])]
    metrics = metrics or sorted({k for row in result["ranked"] if row["scores"] for k in row["scores"]})
    header = ["rank", *tune.space, *metrics]
    lines = [[str(row["rank"] or "-"), *(str(v) for v in row["setting"].values()),
              *(("failed" if not row["scores"] else f"{row['scores'][m]:.4f}") for m in metrics)]
             for row in result["ranked"]]
    widths = [max(len(cell) for cell in column) for column in zip(header, *lines)]
    for cells in (header, *lines):
        print("  " + "  ".join(cell.ljust(width) for cell, width in zip(cells, widths)).rstrip())
    other = "loss" if tune.score.metric == "accuracy" else "accuracy"
    print(f"ranked by {tune.score.metric} on the {tune.score.split} rows "
          f"({'higher' if tune.score.metric == 'accuracy' else 'lower'} first), the mean of {tune.folds} folds; "
          f"ties by {other}, then by the space's order")
    link = run_url(result["tracking_uri"], result["experiment_id"], result["parent_run_id"])
    print(f"MLflow: the rehearsal's run {result['parent_run_id']}" + (f": {link}" if link else ""))
    if result["best"] is None:
        print("no setting finished: nothing was picked; its runs in MLflow say what each raised")
        return
    pick = ", ".join(f"{k} {v}" for k, v in result["best"].items())
    print(f"picked: {pick}")
    if tune.then == "none":
        print(f"next: with tune.then: train, privzo tune {spec.name}'s spec trains the pick once on the private rows "
              f"(privacy.epsilon {spec.privacy.epsilon:g} that run's own, at the one-run sigma); with tune.then: "
              f"search, it searches the best {tune.top} privately (K ~ {RepeatLaw(tune.candidates).describe()}; "
              f"epsilon {result['private_search_epsilon']:.4g} at sigma {result['noise_multiplier']:.4g}); "
              "privzo validate prints each choice's sigma")


def _print_search(spec: specs.RunSpec, result) -> None:
    from flows.record.tracking import run_url

    if result["winner"] is None:
        print(f"{spec.name}: no candidate ran (K drew 0); nothing was released")
        return
    setting = ", ".join(f"{k} {v}" for k, v in result["winner"].items())
    print(f"{spec.name} winner ({setting}): {spec.tune.score.metric} {result['score']:.4f} on the "
          f"{spec.tune.score.split} rows")
    print(summary_line(spec.name, result))
    if spec.tune.score.split == "test":  # the winner was chosen by these very rows
        print(f"note: the candidates were scored on the test rows, so the winner's test {spec.tune.score.metric} is "
              "the best of K noisy estimates and biased in its favour; score on the public rows "
              "(tune.score.split: public) for a test score the selection did not see")
    print(f"privacy: {result['guarantee']}  (sigma {result['noise_multiplier']:.4g})")
    link = run_url(result["tracking_uri"], result["experiment_id"], result["run_id"])
    print(f"MLflow: the search's run {result['parent_run_id']}, the winner's child run {result['run_id']}"
          + (f": {link}" if link else ""))


def _print_trained(spec: specs.RunSpec, result) -> None:
    from flows.record.tracking import run_url

    print(summary_line(spec.name, result))
    if spec.tune.score.split == "test":
        print(f"note: the rehearsal scored its settings on the test rows, so this test {spec.tune.score.metric} "
              "is of a setting they chose, and biased in its favour; score on the public rows "
              "(tune.score.split: public) for a test score the choice did not see")
    print(f"privacy: {result['model_guarantee']}  (target epsilon {result['target_epsilon']}, sigma "
          f"{result['noise_multiplier']:.4g}, {result['steps']} steps)")
    if result.get("model_version"):
        print(f"load it: mlflow.pyfunc.load_model('models:/{spec.name}/{result['model_version']}') with "
              f"MLFLOW_TRACKING_URI={result['tracking_uri']}")
    link = run_url(result["tracking_uri"], result["experiment_id"], result["run_id"])
    print(f"MLflow: the pick's run {result['run_id']}, a child of the rehearsal's" + (f": {link}" if link else ""))


def command(args) -> int:
    spec = installed_spec(args.spec)  # fail fast, before Prefect or MLflow start
    if spec.tune is None:
        raise specs.SpecError("tune: this spec has no tune section; give tune.space and tune.candidates "
                              "(docs/guide/tuning.md), or train it with privzo run")
    from flows.tune import private_tune

    result = private_tune(spec_path=str(args.spec), as_of=args.as_of)
    print()
    if not result.get("rehearsal"):
        _print_search(spec, result)
        return 0
    _print_rehearsal(spec, result)
    then = result.get("then")
    if then is not None:
        print()
        if then["kind"] == "train":
            print("then: the pick trained once on the private rows")
            _print_trained(spec, then)
        else:
            print(f"then: a private search among the rehearsal's best {len(result['top'])}")
            _print_search(spec, then)
    return 0
