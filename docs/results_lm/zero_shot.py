"""The zero-shot rows of docs/results_lm.md: for each seed, the spec's model before any step evaluated on that
seed's test split (what every run logs at step 0; the LoRA adapters start at B = 0, so this is the pretrained
decoder itself), beside chance (1 / classes) and the majority class's share of the test split.

    .venv/bin/python docs/results_lm/zero_shot.py docs/results_lm/chatterbot_lm_dpzero.yaml 0 1 2
"""
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import specs  # noqa: E402
from components import builders, models  # noqa: E402


def main() -> None:
    path, seeds = sys.argv[1], [int(s) for s in sys.argv[2:]] or [0]
    torch.set_num_threads(1)
    rows = []
    for seed in seeds:
        spec = specs.load_spec(path).model_dump(mode="json")
        spec["seed"] = seed
        spec = specs.spec_from_dict(spec)
        data = builders.load_data(spec)
        model = builders.build_model(spec, data.n_features, data.n_classes).eval()
        test = models.evaluate(model, torch.as_tensor(data.test.features), torch.as_tensor(data.test.labels))
        majority = np.bincount(data.test.labels, minlength=data.n_classes).max() / len(data.test.labels)
        rows.append((test["accuracy"], test["loss"], majority, 1 / data.n_classes))
        print(f"seed {seed}: zero-shot accuracy {test['accuracy']:.4f}, loss {test['loss']:.4f}; majority class "
              f"{majority:.4f}, chance {1 / data.n_classes:.4f}; {len(data.private)} private, {len(data.public)} "
              f"public, {len(data.test)} test rows")
    for i, name in enumerate(("zero-shot accuracy", "zero-shot loss", "majority class")):
        values = [r[i] for r in rows]
        spread = f" ± {statistics.stdev(values):.4f}" if len(values) > 1 else ""
        print(f"{name}: {statistics.mean(values):.4f}{spread} (n = {len(values)})")


if __name__ == "__main__":
    main()
