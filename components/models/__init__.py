"""Models and their per-example loss."""
from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import torch
from torch import nn
from torch.nn import functional as F

from components.registry import MODELS
from components.models.hf import TextClassifier, add_adapters_, check_adapter_targets, freeze_

_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU}


def linear(n_features: int, n_classes: int) -> nn.Module:
    return nn.Linear(n_features, n_classes)


def mlp(n_features: int, n_classes: int, hidden: Sequence[int], activation: str = "relu") -> nn.Module:
    layers = []
    width = n_features
    for h in hidden:
        layers += [nn.Linear(width, h), _ACTIVATIONS[activation]()]
        width = h
    layers.append(nn.Linear(width, n_classes))
    return nn.Sequential(*layers)


def cnn(n_features: int, n_classes: int, channels: Sequence[int], activation: str = "relu",
        image_shape: Optional[Tuple[int, int, int]] = None) -> nn.Module:
    """Small CNN on images given as flat rows, channels first: ``image_shape`` (channels, height, width),
    or by default square single-channel images (e.g. digits' 8x8 = 64 features). 3x3 convolutions
    (padding 1) with ``channels`` output channels each, one 2x2 max-pool after the last, then a linear
    classifier. No normalisation layers (nothing computed across examples)."""
    if image_shape is None:
        side = math.isqrt(n_features)
        if side * side != n_features or side < 2:
            raise ValueError(f"model.kind cnn: needs images; {n_features} features is not a square single-channel "
                             "image (use data.source.kind: images for other shapes)")
        image_shape = (1, side, side)
    depth, height, width_px = image_shape
    if depth * height * width_px != n_features:
        raise ValueError(f"model.kind cnn: rows of {n_features} features are not {depth}x{height}x{width_px} images")
    layers: list = [nn.Unflatten(1, tuple(image_shape))]
    width = depth
    for c in channels:
        layers += [nn.Conv2d(width, c, 3, padding=1), _ACTIVATIONS[activation]()]
        width = c
    layers += [nn.MaxPool2d(2), nn.Flatten(), nn.Linear(width * (height // 2) * (width_px // 2), n_classes)]
    return nn.Sequential(*layers)


@torch.no_grad()
def initialise_(model: nn.Module, generator: torch.Generator) -> None:
    """Re-draw every Linear and Conv2d layer with torch's default scheme (Kaiming-uniform weights,
    a=sqrt(5); bias uniform in +-1/sqrt(fan_in)) from ``generator``, so initialisation is reproducible
    from the public seed without touching the global RNG."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5), generator=generator)
            if module.bias is not None:
                fan_in = module.weight[0].numel()  # in_features, or in_channels * kernel area
                bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
                nn.init.uniform_(module.bias, -bound, bound, generator=generator)


def text_classifier(name: str, n_classes: int, trainable: str, generator: torch.Generator,
                    adapters: Optional[Tuple[int, float, Sequence[str]]] = None) -> nn.Module:
    """Pretrained encoder ``name`` (from its package, offline) + mean pooling + a linear head initialised
    from ``generator``; parameters outside ``trainable`` (head, bias, lora, all) are frozen. ``adapters``
    (rank, alpha, target layer names): LoRA adapters for trainable lora, drawn from ``generator`` after
    the head."""
    from components import pretrained

    if (trainable == "lora") != (adapters is not None):
        raise ValueError("model.lora: adapters are given exactly when trainable is lora")
    encoder = pretrained.encoder(name)
    with torch.device("meta"):
        head = nn.Linear(encoder.config.hidden_size, n_classes)
    head = head.to_empty(device="cpu")
    initialise_(head, generator)  # the head only: the encoder's Linear layers keep their pretrained weights
    if adapters is not None:
        rank, alpha, targets = adapters
        add_adapters_(encoder, rank, alpha, targets, generator)
    model = TextClassifier(encoder, head)
    freeze_(model, trainable)
    return model


def per_example_loss(model: nn.Module, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy per example, shape [b] (no reduction: clipping is per example); a synthetic problem's
    model (``objective``) outputs its per-example loss itself."""
    if getattr(model, "objective", None):
        return model(features)
    return F.cross_entropy(model(features), labels, reduction="none")


@torch.inference_mode()
def evaluate(model: nn.Module, features: torch.Tensor, labels: torch.Tensor, batch_size: int = 4096) -> dict:
    """Accuracy and mean loss on a split that is not private training data (test or public)."""
    exact = getattr(model, "exact_metrics", None)
    if exact is not None:
        # the KL paper's problems: exact risk over the simulated rows (a public function of the spec)
        return exact()
    if len(labels) == 0:
        return {"accuracy": float("nan"), "loss": float("nan")}
    # a language model's activations per row are far larger than a classifier's: it names its own batch
    batch_size = min(batch_size, getattr(model, "eval_batch_size", batch_size))
    own = getattr(model, "metrics", None)
    if own is not None:
        # a model scored by its own rule (a completion's loss and exact match: components/models/lm.py)
        return own(features, batch_size)
    if getattr(model, "objective", None):
        # a synthetic problem: its population objective is known exactly (no row is read for it)
        losses = torch.cat([model(features[s:s + batch_size]) for s in range(0, len(labels), batch_size)])
        return {"loss": float(losses.mean()), "excess_risk": model.population_value()}
    correct, total_loss = 0, 0.0
    for start in range(0, len(labels), batch_size):
        x, y = features[start : start + batch_size], labels[start : start + batch_size]
        logits = model(x)
        total_loss += float(F.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(dim=1) == y).sum())
    return {"accuracy": correct / len(labels), "loss": total_loss / len(labels)}


def trainable_parameters(model: nn.Module) -> list:
    return [p for p in model.parameters() if p.requires_grad]


def _from_shapes(shapes, generator: Optional[torch.Generator]) -> nn.Module:
    """Build on the meta device (nothing allocated, no global RNG drawn); with a generator, allocate and
    draw the public initialisation from it."""
    with torch.device("meta"):
        model = shapes()
    if generator is None:
        return model
    model = model.to_empty(device="cpu")
    initialise_(model, generator)
    return model


@MODELS.register("linear")
def _linear(spec, n_features: int, n_classes: int, generator: Optional[torch.Generator] = None) -> nn.Module:
    return _from_shapes(lambda: linear(n_features, n_classes), generator)


@MODELS.register("mlp")
def _mlp(spec, n_features: int, n_classes: int, generator: Optional[torch.Generator] = None) -> nn.Module:
    return _from_shapes(lambda: mlp(n_features, n_classes, spec.model.hidden, spec.model.activation), generator)


@MODELS.register("cnn")
def _cnn(spec, n_features: int, n_classes: int, generator: Optional[torch.Generator] = None) -> nn.Module:
    source = spec.data.source
    shape = source.image_shape if source.kind in ("images", "packaged_images") else None
    return _from_shapes(lambda: cnn(n_features, n_classes, spec.model.channels, spec.model.activation, shape),
                        generator)


@MODELS.register("hf")
def _hf(spec, n_features: int, n_classes: int, generator: Optional[torch.Generator] = None) -> nn.Module:
    """Pretrained weights come from the package; only the head is drawn, as the other models are."""
    if generator is None:
        raise ValueError("model.kind: hf is sized by its weights, not its shapes; load it")
    lora = spec.model.lora
    adapters = None if lora is None else (lora.rank, lora.alpha, tuple(lora.targets))
    return text_classifier(spec.model.weights, n_classes, spec.model.trainable, generator, adapters)
