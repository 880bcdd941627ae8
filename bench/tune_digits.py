"""docs/results.md's tune table: on digits at epsilon 2, each over seeds 0-2, test accuracy:
- the recommended path, `privzo tune specs/examples/digits_tune_rehearsed.yaml`: a rehearsal on the public rows
  (4 folds, held-out loss, the private run's noise per example), its pick trained once at the one-run sigma;
- the same rehearsal's best 3 searched privately (what tune.then: search runs: tune.among, K ~ Poisson(2), the
  cheapest law at that mean by privzo validate);
- the search as it is, `privzo tune specs/examples/digits_tune.yaml` (K ~ TNB(6, 0.5) over all 12 settings);
- the hand-tuned digits_dpzero.yaml (its lr and clip chosen outside any guarantee) and the grid's worst setting.
Every path but the last two is inside the guarantee.

The worst setting is found by training every setting of the grid once (seed 0) at epsilon 2, outside any
guarantee, for this comparison only; those runs are not a search privzo releases.

    .venv/bin/python bench/tune_digits.py [--epochs 200] [--processes 2] [--only recommended] [--seeds 0,1,2]
    .venv/bin/python bench/tune_digits.py --compare 0.05,0.5 --seeds 0,1,2,3,4,5

``--only recommended`` runs the first two rows alone (the rehearsal and its narrowed search, seeds 0-2).
``--compare LR,CLIP`` trains that setting (a rehearsal's pick) and the hand-tuned one once a seed at epsilon 2,
outside any guarantee, for docs/results.md's comparison on more seeds than the paths above.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from concurrent.futures import ProcessPoolExecutor
from typing import Dict, List

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "specs", "examples")
SEEDS = (0, 1, 2)


def _example(name: str) -> dict:
    with open(os.path.join(EXAMPLES, name)) as f:
        return yaml.safe_load(f)


def trained_accuracy(spec_dict: dict) -> float:
    """One private run of ``spec_dict`` at its epsilon, in-process (noise from the OS), its test accuracy."""
    import torch

    import specs
    from components import builders, models

    torch.set_num_threads(1)
    spec = specs.spec_from_dict(spec_dict)
    data = builders.load_data(spec)
    resolved, _, _ = builders.resolve_privacy(spec, len(data.private))
    built = builders.build_loop(resolved, data)
    builders.public_warm_start(resolved, built)
    built.loop.run(resolved.optimizer.steps)
    x, y = torch.as_tensor(data.test.features), torch.as_tensor(data.test.labels)
    return float(models.evaluate(built.model, x, y)["accuracy"])


def _with(base: dict, setting: Dict, seed: int, epochs: int) -> dict:
    d = yaml.safe_load(yaml.safe_dump(base))
    d.pop("tune", None)
    d["seed"], d["execution"] = seed, {"backend": "local"}
    d["optimizer"]["epochs"] = epochs
    for path, value in setting.items():
        section, field = path.split(".")
        d[section][field] = value
    return d


def recommended(seed: int, epochs: int, folder: str) -> dict:
    """One seed of the recommended path (rehearsal, its pick trained once), then a small private search among the
    same rehearsal's best 3, as tune.then: search would run it: each a private-tune flow run of its own."""
    import time

    from flows.tune import private_tune

    began = time.monotonic()
    d = _example("digits_tune_rehearsed.yaml")
    d["seed"], d["optimizer"]["epochs"] = seed, epochs
    d["tracking"]["uri"] = f"sqlite:///{folder}/mlflow-rehearsed-{seed}.db"
    rehearsed = private_tune(spec=d)
    narrowed = yaml.safe_load(yaml.safe_dump(d))
    narrowed["tune"].update(rows="private", then="none", among=rehearsed["top"],
                            candidates={"distribution": "poisson", "mean": 2})
    searched = private_tune(spec=narrowed)
    print(f"seed {seed}: the rehearsal's pick {_setting(rehearsed['best'])}, trained once: test accuracy "
          f"{rehearsed['then']['eval/accuracy']:.3f}; its best 3 searched: "
          + (f"{searched.get('eval/accuracy'):.3f}" if searched["winner"] is not None else "K = 0, nothing released")
          + f" ({time.monotonic() - began:.0f} s)", flush=True)
    return {"pick": rehearsed["best"], "pick_accuracy": rehearsed["then"]["eval/accuracy"], "top": rehearsed["top"],
            "search_winner": searched["winner"], "search_accuracy": searched.get("eval/accuracy")}


def _setting(setting: Dict) -> str:
    return ", ".join(f"{k.split('.')[1]} {v}" for k, v in setting.items())


def _shown(values: List[float]) -> str:
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}" if len(values) > 1 else f"{values[0]:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--only", choices=("recommended",), help="the recommended path's rows alone")
    parser.add_argument("--seeds", type=lambda s: tuple(int(x) for x in s.split(",")), default=SEEDS)
    parser.add_argument("--compare", type=lambda s: dict(zip(("optimizer.lr", "mechanism.clip"), map(float, s.split(",")))),
                        help="LR,CLIP: that setting against the hand-tuned one, one run a seed")
    args = parser.parse_args()
    seeds = args.seeds
    tune_base = _example("digits_tune.yaml")
    hand = _example("digits_dpzero.yaml")
    hand_setting = {"optimizer.lr": hand["optimizer"]["lr"], "mechanism.clip": hand["mechanism"]["clip"]}
    if args.compare:
        with ProcessPoolExecutor(args.processes) as pool:
            for label, setting in (("the setting given", args.compare), ("hand-tuned", hand_setting)):
                runs = list(pool.map(trained_accuracy, [_with(tune_base, setting, seed, args.epochs) for seed in seeds]))
                print(f"| {label}, {_setting(setting)} | {_shown(runs)} | {', '.join(f'{a:.3f}' for a in runs)} |")
        return
    grid = [dict(zip(tune_base["tune"]["space"], values)) for values in _product(tune_base["tune"]["space"])]

    folder = tempfile.mkdtemp(prefix="tune-digits-")
    with ProcessPoolExecutor(args.processes) as pool:
        rehearsed = list(pool.map(recommended, seeds, [args.epochs] * len(seeds), [folder] * len(seeds)))
    if args.only == "recommended":
        _recommended_rows(rehearsed, seeds)
        return
    with ProcessPoolExecutor(args.processes) as pool:
        screened = list(pool.map(trained_accuracy, [_with(tune_base, s, 0, args.epochs) for s in grid]))
        worst = grid[min(range(len(grid)), key=lambda i: screened[i])]
        worst_runs = list(pool.map(trained_accuracy, [_with(tune_base, worst, seed, args.epochs) for seed in seeds]))
        hand_runs = list(pool.map(trained_accuracy, [_with(tune_base, hand_setting, seed, args.epochs)
                                                     for seed in seeds]))
    from flows.tune import private_tune

    winners = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            d = yaml.safe_load(yaml.safe_dump(tune_base))
            d["seed"] = seed
            d["optimizer"]["epochs"] = args.epochs
            d["tracking"]["uri"] = f"sqlite:///{tmp}/mlflow-{seed}.db"
            result = private_tune(spec=d)
            winners.append((result["winner"], result["eval/accuracy"]))
    print("grid at epsilon 2, seed 0 (outside any guarantee, to find the worst): "
          + ", ".join(f"{s} {a:.3f}" for s, a in zip(grid, screened)))
    _recommended_rows(rehearsed, seeds)
    print(f"| privzo tune over all 12, K ~ TNB(6, 0.5) | {_shown([a for _, a in winners])} | "
          + "; ".join(_setting(w) for w, _ in winners) + " |")
    print(f"| hand-tuned digits_dpzero.yaml (chosen outside it) | {_shown(hand_runs)} | lr {hand_setting['optimizer.lr']}, "
          f"clip {hand_setting['mechanism.clip']} |")
    print(f"| the grid's worst setting | {_shown(worst_runs)} | lr {worst['optimizer.lr']}, clip {worst['mechanism.clip']} |")


def _recommended_rows(rehearsed: List[dict], seeds) -> None:
    for seed, r in zip(seeds, rehearsed):
        print(f"seed {seed}: the rehearsal's best 3: " + "; ".join(_setting(t) for t in r["top"]))
    print(f"| digits, DPZero, epsilon 2 | test accuracy, seeds {', '.join(map(str, seeds))} | hyperparameters |")
    print("|---|---|---|")
    print(f"| rehearsal, then its pick trained once (recommended) | {_shown([r['pick_accuracy'] for r in rehearsed])} | "
          + "; ".join(_setting(r["pick"]) for r in rehearsed) + " |")
    released = [r for r in rehearsed if r["search_winner"] is not None]
    print(f"| rehearsal, then a private search of its best 3, K ~ Poisson(2) | "
          f"{_shown([r['search_accuracy'] for r in released]) if released else '-'}"
          + (f" ({len(rehearsed) - len(released)} drew K = 0, nothing released)" if len(released) < len(rehearsed) else "")
          + " | " + "; ".join(_setting(r["search_winner"]) if r["search_winner"] else "none" for r in rehearsed) + " |")


def _product(space: Dict[str, list]):
    grid = [[]]
    for values in space.values():
        grid = [g + [v] for g in grid for v in values]
    return grid


if __name__ == "__main__":
    main()
