"""The settings of the language-model examples (specs/examples/chatterbot_lm_*.yaml), chosen from public rows
only: no private row and no test row is read here. Two choices, in this order:

1. **The task** (``topics``): which chatterbot topics the pretrained decoder can already tell apart through the prompt.
   On the public rows of the 21-topic spec (seed 0's split), each topic's label word is scored by how well
   its logit (less the row's mean over the 21 words) ranks the topic's own rows above the others' (the area
   under the ROC curve); the TOPICS best-scored topics are the task, in file-name order.
2. **The learning rate and the trainable set**: a rehearsal of the example's DPZero run on the public rows,
   without noise (mechanism none: the public rows need none): half of them train, the other half score, for
   the example's steps, at each rate of ``--rates`` and with the spec's adapters or ``--targets``/``--rank``;
   the setting with the best held-out public accuracy (the example's headline; its loss beside) is the
   example's. Each setting is printed with its public loss and accuracy before and after.

The topics step found too few public rows per topic to rank them (1-4 for most), so the examples kept all 21
(docs/results_lm.md, "How they were chosen").

    .venv/bin/python docs/results_lm/public_choices.py topics specs/examples/chatterbot_lm_dpzero.yaml
    .venv/bin/python docs/results_lm/public_choices.py rates specs/examples/chatterbot_lm_dpzero.yaml
    .venv/bin/python docs/results_lm/public_choices.py rates specs/examples/chatterbot_lm_dpzero.yaml --targets q_proj v_proj
"""
import copy
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import specs  # noqa: E402
from components import builders, models  # noqa: E402
from components.data.split import Part, SplitData  # noqa: E402

TOPICS = 4
RATES = [1e-3, 3e-3, 1e-2, 3e-2]
# recipes/pretrain_decoder.py's LABEL_WORDS, by topic (file-name order)
WORDS = {"ai": "AI", "botprofile": "me", "coding": "code", "computers": "computers", "conversations": "conversation",
         "emotion": "emotions", "food": "food", "gossip": "gossip", "greetings": "greetings", "health": "health",
         "history": "history", "humor": "humor", "literature": "literature", "money": "money", "movies": "movies",
         "politics": "politics", "psychology": "psychology", "science": "science", "sports": "sports",
         "tech_support": "support", "trivia": "trivia"}


def _spec(path: str, **changes) -> specs.RunSpec:
    data = specs.load_spec(path).model_dump(mode="json")
    for dotted, value in changes.items():
        *owners, key = dotted.split(".")
        node = data
        for owner in owners:
            node = node[owner]
        if value is None:
            node.pop(key, None)
        else:
            node[key] = value
    return specs.spec_from_dict(data)


def auc(scores: np.ndarray, positive: np.ndarray) -> float:
    """P(a positive row scores above a negative one), ties counted half (Mann-Whitney)."""
    pos, neg = scores[positive], scores[~positive]
    greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(greater / (len(pos) * len(neg)))


def choose_topics(path: str) -> None:
    topics = list(WORDS)
    spec = _spec(path, **{"seed": 0, "data.source.topics": topics,
                          "model.prompt.words": [WORDS[t] for t in topics]})
    data = builders.load_data(spec)
    model = builders.build_model(spec, data.n_features, data.n_classes).eval()
    with torch.no_grad():
        logits = model(torch.as_tensor(data.public.features)).numpy()
    centred = logits - logits.mean(axis=1, keepdims=True)
    labels = data.public.labels
    scored = sorted(((auc(centred[:, k], labels == k), t) for k, t in enumerate(topics)
                     if (labels == k).any()), reverse=True)
    print(f"{len(labels)} public rows of seed 0's split (21 topics); label word's AUC on its topic's rows:")
    for score, topic in scored:
        print(f"  {topic:14s} {WORDS[topic]:12s} AUC {score:.3f}  ({int((labels == topics.index(topic)).sum())} rows)")
    chosen = [t for t in topics if t in {topic for _, topic in scored[:TOPICS]}]
    print(f"task: topics {chosen}, words {[WORDS[t] for t in chosen]}")


def rehearse(path: str, rates=RATES, targets=None, rank=None) -> None:
    torch.set_num_threads(1)
    spec = specs.load_spec(path)
    if targets or rank:  # another trainable set: the adapters' targets (and rank, alpha = 2 rank as the default's)
        lora = {**spec.model.lora.model_dump(), **({"targets": targets} if targets else {}),
                **({"rank": rank, "alpha": 2.0 * rank} if rank else {})}
        spec = _spec(path, **{"model.lora": lora})
    data = builders.load_data(spec)
    public = data.public
    order = np.random.default_rng(0).permutation(len(public))
    half = len(order) // 2

    def part(idx):
        return Part(public.features[idx], public.labels[idx], [public.fingerprints[i] for i in idx])

    empty = part(np.array([], dtype=np.int64))
    rehearsal = SplitData(public=empty, private=part(order[:half]), test=part(order[half:]),
                          n_classes=data.n_classes, n_features=data.n_features, layout=data.layout)
    lora = spec.model.lora
    print(f"rehearsal: {half} public rows train, {len(order) - half} public rows score; {spec.optimizer.steps} "
          f"steps of two_point, {spec.estimator.queries} queries, no noise; LoRA rank {lora.rank} on "
          f"{', '.join(lora.targets)}")
    for queries in sorted({spec.estimator.queries}):
        for lr in rates:
            changed = copy.deepcopy(spec.model_dump(mode="json"))
            changed.update(mechanism={"kind": "none"}, privacy=None, budget=None)
            changed["optimizer"]["lr"] = lr
            changed["estimator"]["queries"] = queries
            changed["data"].pop("declared_private_rows", None)
            if changed["estimator"]["kind"] != "two_point":
                changed["estimator"] = {"kind": "two_point", "queries": queries,
                                        "smoothing": changed["estimator"]["smoothing"], "directions": "gaussian"}
            resolved, _rate, _planned = builders.plan(specs.spec_from_dict(changed), rehearsal)
            built = builders.build_loop(resolved, rehearsal)
            test = torch.as_tensor(rehearsal.test.features), torch.as_tensor(rehearsal.test.labels)
            before = models.evaluate(built.model, *test)
            built.loop.run(resolved.optimizer.steps)
            after = models.evaluate(built.model, *test)
            print(f"  queries {queries} lr {lr:g}: held-out public loss {before['loss']:.4f} -> {after['loss']:.4f}, "
                  f"accuracy {before['accuracy']:.3f} -> {after['accuracy']:.3f}", flush=True)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["topics", "rates"])
    parser.add_argument("spec")
    parser.add_argument("--rates", nargs="+", type=float, default=RATES)
    parser.add_argument("--targets", nargs="+", default=None, help="rates: the adapters' targets instead of the spec's")
    parser.add_argument("--rank", type=int, default=None, help="rates: the adapters' rank instead of the spec's")
    args = parser.parse_args()
    if args.what == "topics":
        choose_topics(args.spec)
    else:
        rehearse(args.spec, args.rates, args.targets, args.rank)
