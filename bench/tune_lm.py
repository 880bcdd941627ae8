"""docs/results.md's tune rows for a language model: chatterbot_lm_dpzero.yaml (DPZero, LoRA on the LM head of
recipes/pretrain_decoder.py's decoder, epsilon 4), each over seeds 0-2, test accuracy and test loss:
- the recommended path: a rehearsal of the learning rate on the public rows (4 folds, held-out loss, the private
  run's noise per example), its pick trained once at the one-run sigma (what `privzo tune` runs for the spec
  with the tune section below);
- the example as written: its Adam lr chosen by hand on public rows (docs/results_lm/public_choices.py rates).
Both are inside the guarantee: neither choice read a private row.

    .venv/bin/python recipes/pretrain_decoder.py      # once: the decoder the example reads
    .venv/bin/python bench/tune_lm.py [--seeds 0,1,2] [--rates 1e-3,3e-3,1e-2,3e-2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import List

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "specs", "examples", "chatterbot_lm_dpzero.yaml")


def _spec(seed: int, folder: str, name: str) -> dict:
    with open(EXAMPLE) as f:
        d = yaml.safe_load(f)
    d["seed"] = seed
    d["model"]["path"] = os.path.expanduser(d["model"]["path"])  # a spec given as a dict is not anchored as a file's is
    d["tracking"]["uri"] = f"sqlite:///{folder}/mlflow-{name}-{seed}.db"
    return d


def _shown(values: List[float]) -> str:
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}" if len(values) > 1 else f"{values[0]:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=lambda s: tuple(int(x) for x in s.split(",")), default=(0, 1, 2))
    parser.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[1e-3, 3e-3, 1e-2, 3e-2])
    args = parser.parse_args()
    from flows.private_train import private_train
    from flows.tune import private_tune

    folder = tempfile.mkdtemp(prefix="tune-lm-")
    rows = []
    for seed in args.seeds:
        began = time.monotonic()
        hand = private_train(spec=_spec(seed, folder, "hand"))
        d = _spec(seed, folder, "rehearsed")
        d["tune"] = {"space": {"optimizer.lr": args.rates}, "rows": "public", "folds": 4,
                     "score": {"split": "public", "metric": "loss"}, "then": "train"}
        rehearsed = private_tune(spec=d)
        picked = rehearsed["then"]
        row = {"seed": seed, "lr": rehearsed["best"]["optimizer.lr"],
               "pick": (picked["eval/accuracy"], picked["eval/loss"]),
               "hand": (hand["eval/accuracy"], hand["eval/loss"]),
               "scores": [(r["setting"]["optimizer.lr"], r["scores"] and r["scores"]["loss"])
                          for r in rehearsed["settings"]]}
        rows.append(row)
        print(f"seed {seed}: rehearsal held-out public loss by lr "
              + ", ".join(f"{lr:g} {loss:.4f}" if loss is not None else f"{lr:g} failed" for lr, loss in row["scores"])
              + f"; pick lr {row['lr']:g}: test accuracy {row['pick'][0]:.3f}, loss {row['pick'][1]:.3f}; "
              f"hand lr {d['optimizer']['lr']:g}: {row['hand'][0]:.3f}, loss {row['hand'][1]:.3f} "
              f"({time.monotonic() - began:.0f} s)", flush=True)
    seeds = ", ".join(str(r["seed"]) for r in rows)
    print(f"| chatterbot LM, DPZero, epsilon 4 | test accuracy, seeds {seeds} | test loss | lr |")
    print("|---|---|---|---|")
    print(f"| rehearsal, then its pick trained once (recommended) | {_shown([r['pick'][0] for r in rows])} | "
          f"{_shown([r['pick'][1] for r in rows])} | " + "; ".join(f"{r['lr']:g}" for r in rows) + " |")
    print(f"| hand-chosen on public rows (the example) | {_shown([r['hand'][0] for r in rows])} | "
          f"{_shown([r['hand'][1] for r in rows])} | 0.01 |")


if __name__ == "__main__":
    main()
