"""The ``model`` section: what is trained, one ``kind`` per architecture."""
from __future__ import annotations

from typing import Annotated, ClassVar, List, Literal, Optional, Union

from pydantic import Field, PositiveFloat, PositiveInt, field_validator, model_validator

from specs.base import Strict


class LinearModel(Strict):
    kind: Literal["linear"]


class MlpModel(Strict):
    kind: Literal["mlp"]
    hidden: List[PositiveInt] = Field(default_factory=lambda: [128], min_length=1)
    activation: Literal["relu", "tanh", "gelu"] = "relu"


class CnnModel(Strict):
    """Small CNN for square single-channel images (digits: 8x8): 3x3 convolutions with ``channels``
    output channels, one 2x2 max-pool, a linear classifier; no normalisation layers."""

    kind: Literal["cnn"]
    channels: List[PositiveInt] = Field(default_factory=lambda: [8, 16], min_length=1)
    activation: Literal["relu", "tanh", "gelu"] = "relu"


class LoraSpec(Strict):
    """Low-rank adapters (LoRA, through peft) on the encoder's Linear layers named in ``targets``:
    W x + (alpha / rank) B A x, with A drawn from the public seed and B = 0, so training starts from the
    pretrained encoder's own function. Only A, B and the head are trained."""

    rank: PositiveInt = 8
    alpha: PositiveFloat = 16.0
    targets: List[str] = Field(default_factory=lambda: ["query", "value"], min_length=1,
                               description="Names of Linear layers (the last part of their module name; "
                               "BERT-like encoders: query, key, value, dense; Llama-like decoders: q_proj, k_proj, "
                               "v_proj, o_proj, gate_proj, up_proj, down_proj, and lm_head, the LM head itself).")


def _as_path(value: Optional[str]) -> Optional[str]:
    # a path always holds a '/', which is how the loader tells it from a registered name
    return value if value is None or "/" in value else f"./{value}"


class HfModel(Strict):
    """A pretrained transformer encoder, from an installed package (``name``) or a local folder written by
    ``save_pretrained`` (``path``), never downloaded; mean pooling over the attention mask, and a linear
    head drawn from the public seed."""

    kind: Literal["hf"]
    name: Optional[Literal["minilm"]] = Field(None, description="minilm: all-MiniLM-L6-v2 (22.7M parameters).")
    path: Optional[str] = Field(None, min_length=1, description="A folder with the encoder's config, weights and "
                                "tokenizer (save_pretrained), read offline. A relative path is taken from the "
                                "folder of the spec file it is written in.")
    trainable: Literal["head", "bias", "lora", "all_but_embeddings", "all"] = Field(
        "head", description="head: the linear head only; bias: the head and every bias of the encoder (BitFit); "
        "lora: the head and low-rank adapters (see lora); all_but_embeddings: every parameter but the encoder's "
        "embedding tables; all: every parameter. Frozen parameters are never perturbed nor updated.")
    lora: Optional[LoraSpec] = Field(None, description="Adapters of trainable: lora (default rank 8 on query "
                                     "and value).")

    @field_validator("path")
    @classmethod
    def _path_is_a_path(cls, value):
        return _as_path(value)

    @model_validator(mode="after")
    def _name_or_path(self):
        if (self.name is None) == (self.path is None):
            raise ValueError("give name (a model shipped in a package) or path (a local folder), one of them")
        if self.lora is not None and self.trainable != "lora":
            raise ValueError("lora: only used with trainable: lora; set trainable: lora or remove lora")
        return self

    @model_validator(mode="before")
    @classmethod
    def _default_adapters(cls, data):
        # written out, so the resolved spec (and its MLflow params) names the adapters that were trained
        if isinstance(data, dict) and data.get("trainable") == "lora" and data.get("lora") is None:
            return {**data, "lora": {}}
        return data

    @property
    def weights(self) -> str:
        """Where the encoder comes from: the registered name or the folder."""
        return self.name or self.path


MASK = "[MASK]"  # where a masked LM's answer goes in a template: the tokenizer's own mask token
TEXT_SLOT = "{text}"  # where a row's text goes in a template


def _one_text_slot(template: str) -> str:
    if template.count(TEXT_SLOT) != 1:
        raise ValueError(f"needs the row's slot {TEXT_SLOT} exactly once (found it {template.count(TEXT_SLOT)} "
                         "times); e.g. '{text} It was'")
    return template


def _causal_template(template: str) -> str:
    if MASK in template:
        raise ValueError(f"a causal LM reads its answer as the next token after the prompt, not at {MASK}; remove "
                         f"{MASK} (the answer follows the template), or use model.kind: masked_lm")
    return _one_text_slot(template)


class _LabelWords(Strict):
    kind: Literal["label_words"]
    template: str  # each prompt states its own rule and example
    words: List[str] = Field(..., min_length=2, description="One label word per class, in the order of the "
                             "classes; each must be one token of the model's tokenizer (checked when the model "
                             "is loaded).")

    @field_validator("words")
    @classmethod
    def _plain_distinct_words(cls, value):
        for word in value:
            if not word or word != word.strip():
                raise ValueError(f"{word!r} has surrounding spaces or is empty; write the bare word (the space "
                                 "before it comes from the template)")
        if len(set(value)) != len(value):
            raise ValueError("must be distinct (one per class)")
        return value


class CausalLabelWords(_LabelWords):
    """Classification by label words (LM-BFF; MeZO's prompts) with a causal LM: a row's text fills the
    template's {text}, and the class is the label word the model ranks highest as the next token after the
    prompt (the word follows the template after one space, or directly when the template ends in
    whitespace). Loss: cross-entropy over the label words' logits at that position."""

    template: str = Field(..., min_length=1, description="The prompt, with {text} once, e.g. '{text} It was'.")

    @field_validator("template")
    @classmethod
    def _causal(cls, value):
        return _causal_template(value)


class MaskedLabelWords(_LabelWords):
    """Classification by label words (LM-BFF) with a masked LM: a row's text fills the template's {text}, and
    the class is the label word the model ranks highest at the template's [MASK]. Loss: cross-entropy over
    the label words' logits there."""

    template: str = Field(..., min_length=1, description="The prompt, with {text} and [MASK] once each, e.g. "
                          "'{text} It was [MASK].'; [MASK] stands for the tokenizer's own mask token.")

    @field_validator("template")
    @classmethod
    def _one_mask(cls, value):
        if value.count(MASK) != 1:
            raise ValueError(f"a masked LM reads its answer at {MASK}, which must appear exactly once (found it "
                             f"{value.count(MASK)} times); e.g. '{{text}} It was {MASK}.'")
        return _one_text_slot(value)


class CompletionPrompt(Strict):
    """Generation: each row's prompt fills the template's {text} and its completion follows (after one
    space, or directly when the prompt ends in whitespace). Loss: mean cross-entropy over the completion's
    tokens only; evaluation: that loss and exact match (greedy decoding of as many tokens as the completion
    has gives exactly the completion)."""

    kind: Literal["completion"]
    template: str = Field("{text}", min_length=1, description="The prompt around the row's prompt column, with "
                          "{text} once, e.g. 'Question: {text}\nAnswer:'.")

    @field_validator("template")
    @classmethod
    def _causal(cls, value):
        return _causal_template(value)


CausalPrompt = Annotated[Union[CausalLabelWords, CompletionPrompt], Field(discriminator="kind")]


class _LanguageModel(Strict):
    """A pretrained language model with its own LM head (no new head is drawn), read offline from a folder
    written by ``save_pretrained`` (config, every weight, tokenizer), and fine-tuned through a prompt."""

    kind: str  # causal_lm or masked_lm: placed first, as in every section
    path: str = Field(..., min_length=1, description="A folder with the model's config, weights and tokenizer "
                      "(save_pretrained), read offline; every weight must be there. A relative path is taken from "
                      "the folder of the spec file it is written in.")
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="The dtype the weights are loaded and perturbed in. The loss is computed in "
        "float32 from upcast logits either way; a perturbation never writes the weights, so they are restored "
        "exactly at any precision.")
    master_weights: bool = Field(
        True, description="With bf16 or fp16: the optimizer updates float32 copies of the trainable parameters "
        "(4 bytes each) and rounds them into the weights after every step. false: updates are rounded into the "
        "weights in place (MeZO's fp16 recipe, no copy), and one below half a unit in the last place of a "
        "weight is lost.")
    trainable: Literal["all", "all_but_embeddings", "bias", "lora"] = Field(
        "all", description="all: every parameter (MeZO's full fine-tuning); all_but_embeddings: every parameter "
        "but the token and position embeddings and the LM head's vocabulary matrix (often tied to the token "
        "embeddings); bias: every bias (BitFit; some models, Llama's, have none); lora: low-rank adapters only "
        "(see lora). Frozen parameters are never perturbed nor updated.")
    lora: Optional[LoraSpec] = Field(None, description="Adapters of trainable: lora (default rank 8 on q_proj and "
                                     "v_proj for a causal LM, query and value for a masked LM).")
    prompt: object  # the task: each kind declares which prompts it reads

    DEFAULT_TARGETS: ClassVar[List[str]] = []

    @field_validator("path")
    @classmethod
    def _path_is_a_path(cls, value):
        return _as_path(value)

    @model_validator(mode="before")
    @classmethod
    def _default_adapters(cls, data):
        # written out, so the resolved spec (and its MLflow params) names the adapters that were trained
        if isinstance(data, dict) and data.get("trainable") == "lora":
            lora = data.get("lora") or {}
            if isinstance(lora, dict) and "targets" not in lora:
                return {**data, "lora": {**lora, "targets": list(cls.DEFAULT_TARGETS)}}
        return data

    @model_validator(mode="after")
    def _lora_only_with_lora(self):
        if self.lora is not None and self.trainable != "lora":
            raise ValueError("lora: only used with trainable: lora; set trainable: lora or remove lora")
        return self

    @property
    def weights(self) -> str:
        """Where the model comes from: its folder."""
        return self.path

    @property
    def dtype_name(self) -> str:
        """The torch dtype of ``precision``, by name (specs never import torch)."""
        return {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[self.precision]


class CausalLmModel(_LanguageModel):
    """A causal (decoder-only) language model: Llama, Qwen2, Mistral, GPT-2 or OPT architectures. Rows are
    padded on the right; the answer is read at the last prompt token (label words) or the completion's
    tokens are scored one position earlier each (generation)."""

    kind: Literal["causal_lm"]
    prompt: CausalPrompt = Field(..., description="label_words: classification by label words; completion: "
                                 "generation from (prompt, completion) rows (data.source.kind: completions).")

    DEFAULT_TARGETS: ClassVar[List[str]] = ["q_proj", "v_proj"]


class MaskedLmModel(_LanguageModel):
    """A masked language model with its MLM head (BERT or RoBERTa architectures): classification by label
    words at the template's [MASK]."""

    kind: Literal["masked_lm"]
    prompt: MaskedLabelWords = Field(..., description="label_words: the template (with [MASK]) and one word "
                                     "per class.")

    DEFAULT_TARGETS: ClassVar[List[str]] = ["query", "value"]

    @model_validator(mode="before")
    @classmethod
    def _no_generation(cls, data):
        prompt = data.get("prompt") if isinstance(data, dict) else None
        if isinstance(prompt, dict) and prompt.get("kind") == "completion":
            raise ValueError("prompt.kind: completion generates text, which needs a causal LM (kind: causal_lm); "
                             "a masked LM classifies by label_words at [MASK]")
        return data


class ObjectiveModel(Strict):
    """The parameter vector of a synthetic problem (``data.source.kind: synthetic``), its per-example loss
    the problem's own."""

    kind: Literal["objective"]


ModelSpec = Annotated[Union[LinearModel, MlpModel, CnnModel, HfModel, CausalLmModel, MaskedLmModel, ObjectiveModel],
                     Field(discriminator="kind")]
