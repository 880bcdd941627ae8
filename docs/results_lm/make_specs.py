"""Writes this page's specs (docs/results_lm/*.yaml) and the generation rows, for the decoder that
recipes/pretrain_decoder.py saved in MODEL (default ~/.privzo/models/privzo-decoder-v1):

- label words: one per chatterbot topic (WORDS, in the order privzo labels them: file-name order), fixed before
  any run and checked to be one token of the decoder's tokenizer after the prompt (privzo's own check,
  components/data/prompts.label_word_ids);
- chatterbot_lm_{dpzero,pazo_m,dpsgd,pazo_p,pazo_s}.yaml: one spec per method, equal in everything else, and
  chatterbot_lm_dpzero_2000.yaml, DPZero's for 2,000 steps;
- ~/.privzo/data/chatterbot_pairs.jsonl: (prompt, completion) = two consecutive lines of one chatterbot
  conversation (replies of at most 80 characters), and chatterbot_lm_generation.yaml, DPZero on them.

    .venv/bin/python docs/results_lm/make_specs.py [MODEL]
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from components import pretrained  # noqa: E402
from components.data.prompts import Prompt, label_word_ids  # noqa: E402
from components.data.text import chatterbot_english, read_topics  # noqa: E402

HERE = Path(__file__).resolve().parent
TEMPLATE = "{text} This is about"
# one label word per topic, fixed before any run; the recipe was told to keep each one token (--keep-words)
WORDS = {
    "ai": "AI", "botprofile": "me", "coding": "code", "computers": "computers", "conversations": "conversation",
    "emotion": "emotions", "food": "food", "gossip": "gossip", "greetings": "greetings", "health": "health",
    "history": "history", "humor": "humor", "literature": "literature", "money": "money", "movies": "movies",
    "politics": "politics", "psychology": "psychology", "science": "science", "sports": "sports",
    "tech_support": "support", "trivia": "trivia",
}
METHODS = {
    "dpzero": "{kind: two_point, queries: 1, smoothing: 1.0e-3, directions: gaussian}",
    "pazo_m": "{kind: pazo_m, queries: 1, smoothing: 1.0e-3, mix: 0.5, public_batch_size: 32}",
    "dpsgd": "{kind: first_order}",
    # added after the first three had run (the same spec otherwise): PAZO-P and PAZO-S at their defaults, k = 3
    "pazo_p": "{kind: pazo_p, queries: 1, smoothing: 1.0e-3, public_batches: 3, public_batch_size: 32}",
    "pazo_s": "{kind: pazo_s, public_batches: 3, public_batch_size: 32}",
    # the step-count question of DPZero's row: the same spec, ten times the steps (its noise recalibrated)
    "dpzero_2000": "{kind: two_point, queries: 1, smoothing: 1.0e-3, directions: gaussian}",
}
STEPS = {"dpzero_2000": 2000}
# PAZO-S steps to the public candidate it picks, x - lr g, so it takes plain SGD; its lr was set from public rows
# only: Adam's step at lr 1e-3 over d = 32,768 coordinates (1e-3 sqrt(d)) over the norm of a public batch's
# gradient at the start (0.26), 0.68, rounded down
OPTIMIZERS = {"pazo_s": "{{kind: sgd, lr: 0.5, steps: {steps}}}"}
SPEC = """\
# {what} on chatterbot's 21 topics, read by label words through a prompt, fine-tuning LoRA adapters (rank 8,
# q_proj and v_proj) of the decoder that recipes/pretrain_decoder.py pretrains on public text. Written by
# docs/results_lm/make_specs.py; runs on this machine only (the decoder is not shipped): see ../results_lm.md.
name: lm-chatterbot-{method}
seed: 0
data:
  source: {{kind: text, name: chatterbot, max_length: 24}}
  split: {{kind: fraction, public: 0.1, test: 0.2}}
  declared_private_rows: 1345
model:
  kind: causal_lm
  path: {model}
  trainable: lora
  prompt: {{kind: label_words, template: "{template}", words: [{words}]}}
estimator: {estimator}
mechanism: {{kind: gaussian, clip: 1.0}}
privacy: {{epsilon: 4.0, delta: auto, accountant: rdp, neighboring: add_remove}}
sampling: {{kind: poisson, expected_batch_size: 32}}
optimizer: {optimizer}
execution: {{backend: local, threads: 1}}
tracking: {{uri: "sqlite:////tmp/lmres/mlflow.db", log_every: 100}}
"""
WHAT = {"dpzero": "DPZero (estimator two_point)", "pazo_m": "PAZO-M (public gradient mixed in, alpha 0.5)",
        "dpsgd": "DP-SGD (estimator first_order)", "pazo_p": "PAZO-P (a subspace of k = 3 public gradients)",
        "pazo_s": "PAZO-S (the best of k = 3 public gradients, chosen privately)",
        "dpzero_2000": "DPZero (estimator two_point) for 2,000 steps"}
GENERATION = """\
# Generation: DPZero (two_point) on (line, next line) pairs of chatterbot's conversations, LoRA adapters of the
# decoder that recipes/pretrain_decoder.py pretrains; test loss and exact match at step 0 and after. Written by
# docs/results_lm/make_specs.py; runs on this machine only: see ../results_lm.md.
name: lm-chatterbot-generation
seed: 0
data:
  source: {{kind: completions, path: {pairs}, prompt: prompt, completion: completion, max_length: 48}}
  split: {{kind: fraction, public: 0.0, test: 0.2}}
  declared_private_rows: {n}
model:
  kind: causal_lm
  path: {model}
  trainable: lora
  prompt: {{kind: completion, template: "Q: {{text}}\\nA:"}}
estimator: {{kind: two_point, queries: 1, smoothing: 1.0e-3, directions: gaussian}}
mechanism: {{kind: gaussian, clip: 1.0}}
privacy: {{epsilon: 4.0, delta: auto, accountant: rdp, neighboring: add_remove}}
sampling: {{kind: poisson, expected_batch_size: 32}}
optimizer: {{kind: adam, lr: 1.0e-3, steps: 200}}
execution: {{backend: local, threads: 1}}
tracking: {{uri: "sqlite:////tmp/lmres/mlflow.db", log_every: 100}}
"""


def label_words(model: str, topics) -> list:
    """WORDS in the order of the topics, each checked to be one token where the answer goes (privzo's check)."""
    words = [WORDS[topic] for topic in topics]
    label_word_ids(pretrained.tokenizer(model), Prompt("causal", "label_words", TEMPLATE), words)
    return words


def pairs(topics, out: Path) -> int:
    """(line, next line) of every conversation, each pair once, whose next line has at most 80 characters (a
    completion is never cut, so max_length must hold the longest); returns the count."""
    import yaml

    seen, rows = set(), []
    for path in sorted(chatterbot_english().glob("*.yml")):
        doc = yaml.load(path.read_text(encoding="utf-8"), Loader=yaml.BaseLoader)  # noqa: S506 - no objects
        for conversation in doc.get("conversations") or []:
            if isinstance(conversation, str):
                continue
            lines = [line.strip() for line in conversation if isinstance(line, str) and line.strip()]
            for a, b in zip(lines, lines[1:]):
                if (a, b) not in seen and len(b) <= 80:
                    seen.add((a, b))
                    rows.append({"prompt": a, "completion": b})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return len(rows)


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else str(Path.home() / ".privzo" / "models" / "privzo-decoder-v1")
    topics = [topic for topic, _ in read_topics(chatterbot_english())]
    words = label_words(model, topics)
    print("label words:", ", ".join(f"{t}={w}" for t, w in zip(topics, words)))
    for method, estimator in METHODS.items():
        (HERE / f"chatterbot_lm_{method}.yaml").write_text(SPEC.format(
            what=WHAT[method], method=method, model=model, template=TEMPLATE, words=", ".join(words),
            estimator=estimator, optimizer=OPTIMIZERS.get(method, "{{kind: adam, lr: 1.0e-3, steps: {steps}}}").format(
                steps=STEPS.get(method, 200))))
    out = Path.home() / ".privzo" / "data" / "chatterbot_pairs.jsonl"
    n = pairs(topics, out)
    # N: the private rows of an 80/20 split of the pairs after privzo drops exact duplicates (at most n)
    (HERE / "chatterbot_lm_generation.yaml").write_text(GENERATION.format(pairs=out, n=int(0.8 * n), model=model))
    print(f"{n} (prompt, completion) pairs in {out}; specs written to {HERE}")


if __name__ == "__main__":
    main()
