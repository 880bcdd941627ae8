"""A pretrained transformer encoder with mean pooling and a linear head, for token-id rows."""
from __future__ import annotations

import torch
from torch import nn

TRAINABLE = ("head", "bias", "all")


class TextClassifier(nn.Module):
    """logits = head(mean over unmasked tokens of encoder(ids)); rows are int64 [b, 2, length] (ids, mask),
    so a batch is indexed like any other feature tensor."""

    def __init__(self, encoder: nn.Module, head: nn.Linear):
        super().__init__()
        self.encoder = encoder
        self.head = head

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        ids, mask = features[:, 0], features[:, 1]
        # a prepared additive mask is used as given: the encoder then never branches on the data (whether a
        # row has padding), which torch.func.vmap needs for per-example gradients (estimator first_order)
        dtype = self.head.weight.dtype
        additive = (1.0 - mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min
        hidden = self.encoder(input_ids=ids, attention_mask=additive).last_hidden_state
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        # an all-padding row pools to zeros instead of 0/0 (the exported model's example input is one)
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        return self.head(pooled)


def freeze_(model: TextClassifier, trainable: str) -> None:
    """Mark what the run may change: ``head`` the linear head; ``bias`` the head and every encoder bias,
    LayerNorm's included (BitFit); ``all`` everything. Directions and updates are built from
    ``requires_grad`` parameters only, so a frozen parameter is never perturbed nor moved."""
    if trainable not in TRAINABLE:
        raise ValueError(f"model.trainable: unknown {trainable!r}; allowed: {', '.join(TRAINABLE)}")
    for name, p in model.encoder.named_parameters():
        p.requires_grad_(trainable == "all" or (trainable == "bias" and name.endswith("bias")))
    for p in model.head.parameters():
        p.requires_grad_(True)
