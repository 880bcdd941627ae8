"""A Llama-like decoder (Llama, Mistral, Qwen2) as modules on the meta device, built from its config.json alone
with torch's own layers: the names, nesting and shapes transformers gives these architectures, so the memory
plan sizes it exactly as it sizes transformers' own meta model (tests/components/test_memory.py compares every
figure), without importing transformers, which is most of `privzo validate`'s time on a language model's spec.
Any other architecture, or a config that leaves a size to its class's defaults, is sized from transformers'
meta model instead (``decoder_skeleton`` returns None)."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import torch
from torch import nn

ARCHITECTURES = ("llama", "mistral", "qwen2")
# sizes a config must state: the classes' defaults differ between architectures and transformers versions
STATED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
          "tie_word_embeddings")


class _Linear(nn.Linear):
    """nn.Linear (its forward, so the plan treats it as one) without the initialisation: on the meta device
    there is nothing to draw, and torch's init would import its decompositions (over a second)."""

    def reset_parameters(self) -> None:
        pass


class _Embedding(nn.Embedding):
    def reset_parameters(self) -> None:
        pass


class _RMSNorm(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(width))


class _Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, qkv_bias: bool, o_bias: bool):
        super().__init__()
        self.q_proj = _Linear(hidden, heads * head_dim, bias=qkv_bias)
        self.k_proj = _Linear(hidden, kv_heads * head_dim, bias=qkv_bias)
        self.v_proj = _Linear(hidden, kv_heads * head_dim, bias=qkv_bias)
        self.o_proj = _Linear(heads * head_dim, hidden, bias=o_bias)


class _Mlp(nn.Module):
    def __init__(self, hidden: int, inner: int, bias: bool):
        super().__init__()
        self.gate_proj = _Linear(hidden, inner, bias=bias)
        self.up_proj = _Linear(hidden, inner, bias=bias)
        self.down_proj = _Linear(inner, hidden, bias=bias)


class _Layer(nn.Module):
    def __init__(self, c: SimpleNamespace, head_dim: int, qkv_bias: bool, o_bias: bool, mlp_bias: bool):
        super().__init__()
        self.self_attn = _Attention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, head_dim,
                                    qkv_bias, o_bias)
        self.mlp = _Mlp(c.hidden_size, c.intermediate_size, mlp_bias)
        self.input_layernorm = _RMSNorm(c.hidden_size)
        self.post_attention_layernorm = _RMSNorm(c.hidden_size)


class _Rotary(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.register_buffer("inv_freq", torch.empty((dim + 1) // 2), persistent=False)
        self.register_buffer("original_inv_freq", torch.empty((dim + 1) // 2), persistent=False)


class _Body(nn.Module):
    def __init__(self, c: SimpleNamespace, head_dim: int, rotary_dim: int, biases: tuple):
        super().__init__()
        self.embed_tokens = _Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(_Layer(c, head_dim, *biases) for _ in range(c.num_hidden_layers))
        self.norm = _RMSNorm(c.hidden_size)
        self.rotary_emb = _Rotary(rotary_dim)


class DecoderSkeleton(nn.Module):
    """``model`` (embeddings, layers, final norm, rotary frequencies) and ``lm_head``, tied to the token
    table when the config says so, as transformers ties them."""

    def __init__(self, c: SimpleNamespace):
        super().__init__()
        self.config = c
        head_dim = c.head_dim or c.hidden_size // c.num_attention_heads
        rope = c.rope_parameters or c.rope_scaling or {}
        factor = c.partial_rotary_factor or rope.get("partial_rotary_factor") or 1.0
        biases = {"llama": (bool(c.attention_bias), bool(c.attention_bias), bool(c.mlp_bias)),
                  "mistral": (False, False, False), "qwen2": (True, False, False)}[c.model_type]
        self.model = _Body(c, head_dim, int(head_dim * factor), biases)
        self.lm_head = _Linear(c.hidden_size, c.vocab_size, bias=False)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head


def decoder_skeleton(folder: str) -> Optional[DecoderSkeleton]:
    """The folder's decoder on the meta device from config.json alone, or None where transformers' own meta
    model is needed: another architecture, a size left to defaults, or quantization."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or config.get("model_type") not in ARCHITECTURES \
            or any(not isinstance(config.get(k), (int, bool)) for k in STATED) or "quantization_config" in config:
        return None
    keys = ("model_type", "num_key_value_heads", "head_dim", "rope_parameters", "rope_scaling",
            "partial_rotary_factor", "attention_bias", "mlp_bias") + STATED
    c = SimpleNamespace(**{k: config.get(k) for k in keys})
    c.num_key_value_heads = c.num_key_value_heads or c.num_attention_heads
    if not isinstance(c.rope_parameters, dict):
        c.rope_parameters = None
    if not isinstance(c.rope_scaling, dict):
        c.rope_scaling = None
    with torch.device("meta"):
        return DecoderSkeleton(c)
