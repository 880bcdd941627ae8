#!/usr/bin/env bash
# The commands of docs/results_lm.md, from the repository root (the page says which sweeps ran with which files
# and stores; the numbers are the same runs).
# Nothing is downloaded; the decoder and the generation rows are written under ~/.privzo (outside git).
set -euo pipefail
WORDS="AI me code computers conversation emotions food gossip greetings health history humor literature money movies
politics psychology science sports support trivia"
# 1. public pretraining (man pages + Python standard-library docstrings; never chatterbot)
.venv/bin/python recipes/pretrain_decoder.py --out ~/.privzo/models/privzo-decoder-v1 --steps 1500 --threads 1 --layers 4 \
  --hidden 256 --batch 8 --corpus-mb 16 --keep-words $WORDS
# 2. the specs of this page and the (prompt, completion) rows
.venv/bin/python docs/results_lm/make_specs.py
mkdir -p /tmp/lmres
# 3. zero-shot: each seed's split, the decoder before any step
.venv/bin/python docs/results_lm/zero_shot.py docs/results_lm/chatterbot_lm_dpzero.yaml 0 1 2
# 4. prompt classification: every method at both epsilons for one seed, then the next seed (each sweep writes
#    its table and CSV after every cell); then PAZO-P and PAZO-S, and DPZero for 2,000 steps
for seed in 0 1 2; do
  .venv/bin/privzo sweep docs/results_lm/chatterbot_lm_dpzero.yaml docs/results_lm/chatterbot_lm_pazo_m.yaml \
    docs/results_lm/chatterbot_lm_dpsgd.yaml --epsilons 1 4 --seeds $seed \
    --tracking-uri sqlite:////tmp/lmres/mlflow.db --experiment lm-chatterbot --out /tmp/lmres/sweep_seed$seed.md
done
.venv/bin/privzo sweep docs/results_lm/chatterbot_lm_pazo_p.yaml docs/results_lm/chatterbot_lm_pazo_s.yaml \
  --epsilons 1 4 --seeds 0 1 2 --tracking-uri sqlite:////tmp/lmres/mlflow.db --experiment lm-chatterbot \
  --out /tmp/lmres/sweep_pazo_ps.md
.venv/bin/privzo sweep docs/results_lm/chatterbot_lm_dpzero_2000.yaml --epsilons 1 4 --seeds 0 1 2 \
  --tracking-uri sqlite:////tmp/lmres/mlflow.db --experiment lm-chatterbot --out /tmp/lmres/sweep_dpzero_2000.md
.venv/bin/python docs/results_lm/aggregate.py /tmp/lmres/sweep_seed*.csv /tmp/lmres/sweep_pazo_ps.csv \
  /tmp/lmres/sweep_dpzero_2000.csv
# 5. generation: DPZero at epsilon 4, test loss and exact match at step 0 and after
.venv/bin/privzo run docs/results_lm/chatterbot_lm_generation.yaml --no-progress
