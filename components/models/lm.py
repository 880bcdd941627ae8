"""A pretrained language model read through a prompt (model.kind causal_lm, masked_lm), with its own LM head:
classification by label words (LM-BFF, Gao et al. 2021; MeZO, Malladi et al. 2023, Appendix E's prompts)
or generation scored on a completion's tokens.

Rows are int64 [b, 3, length]: token ids, attention mask, and the positions whose output is read
(components/data/prompts.py). Padding is on the right and hidden by the attention mask, so it never changes
a row's loss. The model runs in its loaded precision (model.precision); the logits it returns are float32,
so finite differences of the loss are not lost to bf16 or fp16 rounding.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from components import pretrained
from components.data.prompts import label_word_ids, prompt_of
from components.models.hf import add_adapters_, check_adapter_targets
from components.registry import MODELS

TRAINABLE = ("all", "all_but_embeddings", "bias", "lora")
# rows per evaluation pass: a language model's activations (and a completion's logits over the whole
# vocabulary) are far larger per row than a classifier's
EVAL_BATCH_SIZE = 32


class _Prompted(nn.Module):
    """The language model ``lm``, its hidden states at every position and its LM head (``head_name``)."""

    eval_batch_size = EVAL_BATCH_SIZE

    def __init__(self, lm: nn.Module, causal: bool, head_name: str):
        super().__init__()
        self.lm = lm
        self.causal = causal
        self.head_name = head_name

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        return getattr(self.lm, self.head_name)(hidden)

    def hidden(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The last hidden states [b, length, width]. The attention mask is prepared here (additive, causal for
        a causal LM), so the model never branches on the data (whether a row has padding), which
        torch.func.vmap needs for per-example gradients (estimator first_order)."""
        dtype = self.lm.get_input_embeddings().weight.dtype
        length = ids.shape[1]
        keep = mask[:, None, None, :].to(dtype)
        if self.causal:
            keep = keep * torch.ones(length, length, dtype=dtype, device=ids.device).tril()
        additive = (1.0 - keep) * torch.finfo(dtype).min
        if not self.causal:  # BERT's positions are 0..length-1, RoBERTa's follow its padding id: their own
            return self.lm.base_model(input_ids=ids, attention_mask=additive).last_hidden_state
        # right padding: a token's position is its index (OPT would otherwise count them from a 2-D mask)
        positions = torch.arange(length, device=ids.device).unsqueeze(0)
        return self.lm.base_model(input_ids=ids, attention_mask=additive, position_ids=positions,
                                  use_cache=False).last_hidden_state


class LabelWordClassifier(_Prompted):
    """logits[b, class] = the LM head's logit of class's label word at the row's read position (the [MASK],
    or a causal LM's last prompt token), in float32: cross-entropy over them is the loss (LM-BFF's prompt-based
    fine-tuning), their argmax the prediction, before any training too (zero-shot)."""

    def __init__(self, lm: nn.Module, causal: bool, head_name: str, words: Sequence[int]):
        super().__init__(lm, causal, head_name)
        # not in the state dict: the label words are the spec's, the weights are the model's
        self.register_buffer("words", torch.tensor(list(words), dtype=torch.long), persistent=False)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        ids, mask, read = features[:, 0], features[:, 1], features[:, 2]
        hidden = self.hidden(ids, mask)
        at = (read * torch.arange(ids.shape[1], device=ids.device)).sum(dim=1)  # each row reads one position
        picked = hidden.gather(1, at[:, None, None].expand(-1, 1, hidden.shape[-1])).squeeze(1)
        return self.head(picked).index_select(-1, self.words).float()


class CompletionScorer(_Prompted):
    """forward(rows) = each row's mean cross-entropy over its completion's tokens, float32 [b] (the loss of
    generation; nothing else of the row is scored). ``metrics`` adds exact match: greedy decoding of as many
    tokens as the completion has gives it exactly, which holds iff at every completion position the argmax
    of the next-token logits given the completion so far is the completion's token (one forward pass)."""

    objective = "completion"  # per_example_loss: the model's output is its per-example loss

    def _scored(self, features: torch.Tensor):
        ids, mask, read = features[:, 0], features[:, 1], features[:, 2]
        logits = self.head(self.hidden(ids, mask)).float()
        targets = ids.roll(-1, dims=1)  # position t predicts token t + 1; a read position is never the last
        nll = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
        return logits, targets, read, nll

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        _, _, read, nll = self._scored(features)
        weights = read.to(nll.dtype)
        # an all-padding row (the exported model's example input) scores 0 instead of 0/0
        return (nll * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)

    @torch.inference_mode()
    def metrics(self, features: torch.Tensor, batch_size: int) -> dict:
        """Mean completion loss and exact-match rate over the rows (an evaluation split, never private rows)."""
        total, matched = 0.0, 0
        for start in range(0, len(features), batch_size):
            logits, targets, read, nll = self._scored(features[start:start + batch_size])
            weights = read.to(nll.dtype)
            total += float(((nll * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)).sum())
            matched += int(((logits.argmax(dim=-1) == targets) | (read == 0)).all(dim=1).sum())
        return {"loss": total / len(features), "exact_match": matched / len(features)}


def embedding_tables(lm: nn.Module) -> set:
    """ids of the token and position embedding tables and of the LM head's vocabulary matrix (often the
    token table itself, tied)."""
    tables = {id(m.weight) for m in lm.modules() if isinstance(m, nn.Embedding)}
    out = lm.get_output_embeddings()
    if out is not None:
        tables.add(id(out.weight))
    return tables


def freeze_lm_(lm: nn.Module, trainable: str, path: str) -> None:
    """Mark what the run may change: ``all``; ``all_but_embeddings`` (every parameter but the embedding
    tables and the LM head's vocabulary matrix); ``bias`` (every bias, BitFit); ``lora`` (the adapters only:
    the LM head is the model's own, so nothing else is trained). Directions and updates are built from
    ``requires_grad`` parameters only, so a frozen parameter is never perturbed nor moved."""
    if trainable not in TRAINABLE:
        raise ValueError(f"model.trainable: unknown {trainable!r}; allowed: {', '.join(TRAINABLE)}")
    tables = embedding_tables(lm)
    for name, p in lm.named_parameters():
        p.requires_grad_(trainable == "all" or (trainable == "bias" and name.endswith("bias"))
                         or (trainable == "lora" and ".lora_" in name)
                         or (trainable == "all_but_embeddings" and id(p) not in tables))
    if not any(p.requires_grad for p in lm.parameters()):
        raise ValueError(f"model.trainable: {trainable} leaves nothing to train in {path} (a {lm.config.model_type} "
                         "model without such parameters); use all_but_embeddings or lora")


def language_model(model_spec, n_classes: int, generator: torch.Generator) -> nn.Module:
    """The folder's language model (model.precision), with LoRA adapters drawn from ``generator`` for trainable
    lora, parameters outside ``trainable`` frozen, read through the spec's prompt: a label-word classifier
    (one word per class) or a completion scorer."""
    prompt = prompt_of(model_spec)
    path = model_spec.path
    lm = pretrained.language_model(path, prompt.objective, model_spec.dtype_name)
    if model_spec.lora is not None:
        lora = model_spec.lora
        add_adapters_(lm, lora.rank, lora.alpha, tuple(lora.targets), generator)
    freeze_lm_(lm, model_spec.trainable, path)
    causal, head_name = prompt.objective == "causal", pretrained.LANGUAGE_MODELS[lm.config.model_type][1]
    if prompt.task == "completion":
        return CompletionScorer(lm, causal, head_name)
    return LabelWordClassifier(lm, causal, head_name, _label_words(model_spec, n_classes))


def _label_words(model_spec, n_classes: Optional[int]) -> list:
    words = model_spec.prompt.words
    if n_classes is not None and len(words) != n_classes:
        raise ValueError(f"model.prompt.words: {len(words)} words for the {n_classes} classes of data.source; give "
                         "one word per class, in the order of the classes")
    return label_word_ids(pretrained.tokenizer(model_spec.path), prompt_of(model_spec), words)


def check_language_model(model_spec, n_classes: int) -> None:
    """Before a run starts, from the folder's config and tokenizer alone (no weight read): the architecture
    matches the kind, the adapters' targets exist, something is trainable, and each label word is one
    token, one per class."""
    prompt = prompt_of(model_spec)
    skeleton = pretrained.language_model_skeleton(model_spec.path, prompt.objective)
    if model_spec.lora is not None:
        check_adapter_targets(skeleton, model_spec.lora.targets, model_spec.lora.rank)
    else:
        freeze_lm_(skeleton, model_spec.trainable, model_spec.path)
    if prompt.task == "label_words":
        _label_words(model_spec, n_classes)


@MODELS.register("causal_lm", "masked_lm")
def _language_model(spec, n_features: int, n_classes: int, generator: Optional[torch.Generator] = None) -> nn.Module:
    """Every weight comes from the folder; only LoRA adapters are drawn, from the public seed's generator."""
    if generator is None:
        raise ValueError(f"model.kind: {spec.model.kind} is sized by its weights, not its shapes; load it")
    return language_model(spec.model, n_classes, generator)
