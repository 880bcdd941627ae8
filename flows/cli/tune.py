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


def _print_rehearsal(spec: specs.RunSpec, result) -> int:
    from flows.record.tracking import run_url

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


def command(args) -> int:
    spec = installed_spec(args.spec)  # fail fast, before Prefect or MLflow start
    if spec.tune is None:
        raise specs.SpecError("tune: this spec has no tune section; give tune.space and tune.candidates "
                              "(docs/guide/tuning.md), or train it with privzo run")
    from flows.record.tracking import run_url
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
    print(summary_line(spec.name, result))
    if spec.tune.score.split == "test":  # the winner was chosen by these very rows
        print(f"note: the candidates were scored on the test rows, so the winner's test {spec.tune.score.metric} is "
              "the best of K noisy estimates and biased in its favour; score on the public rows "
              "(tune.score.split: public) for a test score the selection did not see")
    print(f"privacy: {result['guarantee']}  (sigma {result['noise_multiplier']:.4g})")
    link = run_url(result["tracking_uri"], result["experiment_id"], result["run_id"])
    print(f"MLflow: the search's run {result['parent_run_id']}, the winner's child run {result['run_id']}"
          + (f": {link}" if link else ""))
    return 0
