"""A pretrained transformer encoder with mean pooling and a linear head, for token-id rows."""
from __future__ import annotations

import torch
from torch import nn

TRAINABLE = ("head", "bias", "lora", "all_but_embeddings", "all")


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


def linear_widths(module: nn.Module):
    """(in, out) of a Linear layer, or of transformers' Conv1D (GPT-2's linear layers, weight stored [in, out],
    which peft adapts too); None for any other module."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    if type(module).__name__ == "Conv1D" and getattr(module, "weight", None) is not None and module.weight.dim() == 2:
        return tuple(module.weight.shape)
    return None


def check_adapter_targets(encoder: nn.Module, targets, rank: int) -> None:
    """Every target must name Linear layers of the encoder (peft matches the end of a module's name), and
    the rank must be below their widths (a larger one trains more parameters than the layer has)."""
    linear = {name: linear_widths(m) for name, m in encoder.named_modules() if linear_widths(m) is not None}
    for target in targets:
        matched = [w for name, w in linear.items() if name == target or name.endswith("." + target)]
        if not matched:
            known = sorted({name.rsplit(".", 1)[-1] for name in linear})
            raise ValueError(f"model.lora.targets: no Linear layer of the encoder is named {target!r}; its Linear "
                             f"layers are named {', '.join(known)}")
        widest = min(min(w) for w in matched)
        if rank >= widest:
            raise ValueError(f"model.lora.rank: {rank} is not below the width {widest} of the {target!r} layers; "
                             f"use a rank under {widest}")


def add_adapters_(encoder: nn.Module, rank: int, alpha: float, targets, generator: torch.Generator) -> None:
    """LoRA adapters (peft) on the ``targets`` Linear layers: A drawn from ``generator`` (Kaiming-uniform,
    as peft draws it), B = 0, so the encoder computes what it did before. No dropout: both forward passes
    of a finite difference must see one function."""
    import math
    import warnings

    from components.data_check import package_missing

    missing = package_missing("lora", "model.trainable")
    if missing:
        raise ValueError(missing)
    from peft import LoraConfig, inject_adapter_in_model

    check_adapter_targets(encoder, targets, rank)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0, bias="none")
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():  # peft draws A from the global RNG;
        # it is re-drawn below. An adapter on a tied LM head leaves the tied table as it is; peft's warning is
        # about merging such an adapter into it, which privzo never does (a model keeps its adapters apart)
        warnings.filterwarnings("ignore", message="Model has `tie_word_embeddings=True`")
        inject_adapter_in_model(config, encoder)
    with torch.no_grad():
        for name, p in encoder.named_parameters():
            if ".lora_A." in name:
                nn.init.kaiming_uniform_(p, a=math.sqrt(5), generator=generator)
            elif ".lora_B." in name:
                p.zero_()


def freeze_(model: TextClassifier, trainable: str) -> None:
    """Mark what the run may change: ``head`` the linear head; ``bias`` the head and every encoder bias,
    LayerNorm's included (BitFit); ``lora`` the head and the adapters; ``all_but_embeddings`` everything but
    the encoder's embedding tables (word, position, token type); ``all`` everything. Directions and updates
    are built from ``requires_grad`` parameters only, so a frozen parameter is never perturbed nor moved."""
    if trainable not in TRAINABLE:
        raise ValueError(f"model.trainable: unknown {trainable!r}; allowed: {', '.join(TRAINABLE)}")
    tables = {id(m.weight) for m in model.encoder.modules() if isinstance(m, nn.Embedding)}
    for name, p in model.encoder.named_parameters():
        p.requires_grad_(trainable == "all" or (trainable == "bias" and name.endswith("bias"))
                         or (trainable == "lora" and ".lora_" in name)
                         or (trainable == "all_but_embeddings" and id(p) not in tables))
    for p in model.head.parameters():
        p.requires_grad_(True)
