"""The ``model`` section: what is trained, one ``kind`` per architecture."""
from __future__ import annotations

from typing import Annotated, List, Literal, Optional, Union

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
                               "BERT-like encoders: query, key, value, dense).")


class HfModel(Strict):
    """A pretrained transformer encoder, from an installed package (``name``) or a local folder written by
    ``save_pretrained`` (``path``), never downloaded; mean pooling over the attention mask, and a linear
    head drawn from the public seed."""

    kind: Literal["hf"]
    name: Optional[Literal["minilm"]] = Field(None, description="minilm: all-MiniLM-L6-v2 (22.7M parameters).")
    path: Optional[str] = Field(None, min_length=1, description="A folder with the encoder's config, weights and "
                                "tokenizer (save_pretrained), read offline. A relative path is taken from the "
                                "folder of the spec file it is written in.")
    trainable: Literal["head", "bias", "lora", "all"] = Field(
        "head", description="head: the linear head only; bias: the head and every bias of the encoder (BitFit); "
        "lora: the head and low-rank adapters (see lora); all: every parameter. Frozen parameters are never "
        "perturbed nor updated.")
    lora: Optional[LoraSpec] = Field(None, description="Adapters of trainable: lora (default rank 8 on query "
                                     "and value).")

    @field_validator("path")
    @classmethod
    def _path_is_a_path(cls, value):
        # a path always holds a '/', which is how the loader tells it from a registered name
        return value if value is None or "/" in value else f"./{value}"

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


class ObjectiveModel(Strict):
    """The parameter vector of a synthetic problem (``data.source.kind: synthetic``), its per-example loss
    the problem's own."""

    kind: Literal["objective"]


ModelSpec = Annotated[Union[LinearModel, MlpModel, CnnModel, HfModel, ObjectiveModel], Field(discriminator="kind")]
