"""What the rest of privzo asks about a kind, written once: one row per ``kind`` of every spec section.

Plain data (no pydantic, no torch), so the validation rules, the builders, the noise-source choice, the
audit and the tests all read the same row; nothing else restates these facts. A new kind adds its row here
(``tests/specs/test_traits.py`` checks that every ``kind`` in the JSON schema has exactly one row and one
registered builder). See docs/design.md, "Algorithm families".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, FrozenSet, Optional, Tuple

# The three algorithm families. A family owns its validation rules, its plan (steps, sigma, the planned
# DpEvent) and how its mechanism and tracker are assembled; a run's family is chosen once, from its spec.
STANDARD = "standard"    # the private loop: mini-batch zeroth-order and first-order estimators, sgd / adam
NONSMOOTH = "nonsmooth"  # O2NC with zeroth-/first-order oracles, tree aggregation or scheduled Gaussians
KL = "kl"                # full-batch first order under the KL condition, planned or filtered Gaussians
FAMILIES = (STANDARD, NONSMOOTH, KL)

# The shape of what a step releases, which decides the audit's test and whether secure noise pays.
SCALAR = "scalar"        # q clipped scalars (finite differences along public directions)
SELECTION = "selection"  # k + 1 clipped scalars in two adaptive rounds (PAZO-S's candidates)
DENSE = "dense"          # one d-dimensional clipped vector (or a tree's / schedule's running sums of them)


@dataclass(frozen=True)
class EstimatorTraits:
    family: str
    uses_public: bool         # reads public rows every step: refused without them
    release: str              # SCALAR, SELECTION or DENSE
    seeded_directions: bool   # directions regenerated from public seeds, so they can be drawn ahead
    forward_only: bool        # no backpropagation through private rows
    running_sums: bool        # O2NC's SPIDER oracles: increments released as running sums (tree / schedule)
    # clips a person's summed rows (data.blocks.person): its queries are sums of per-row values or
    # gradients, which add up over a person's rows before the clip
    person_level: bool
    title: str                # the algorithm, for people


ESTIMATORS: Dict[str, EstimatorTraits] = {
    #                             family     public release seeded forward-only running-sums person title
    "two_point": EstimatorTraits(STANDARD, False, SCALAR, True, True, False, True, "DPZero (MeZO without a mechanism)"),
    "dpgd_0th": EstimatorTraits(STANDARD, False, DENSE, True, True, False, True, "DPGD-0th (DPZero, Algorithm 1)"),
    "pazo_m": EstimatorTraits(STANDARD, True, SCALAR, True, True, False, True, "PAZO-M"),
    "pazo_p": EstimatorTraits(STANDARD, True, SCALAR, False, True, False, True, "PAZO-P"),
    "pazo_s": EstimatorTraits(STANDARD, True, SELECTION, False, True, False, True, "PAZO-S"),
    "first_order": EstimatorTraits(STANDARD, False, DENSE, False, False, False, True, "DP-SGD"),
    "gep": EstimatorTraits(STANDARD, True, DENSE, False, False, False, False, "GEP"),
    "dope_sgd": EstimatorTraits(STANDARD, True, DENSE, False, False, False, True, "DOPE-SGD"),
    "pda_dpmd": EstimatorTraits(STANDARD, True, DENSE, False, False, False, True, "PDA-DPMD"),
    "zo_spider": EstimatorTraits(NONSMOOTH, False, DENSE, False, True, True, False, "zeroth-order SPIDER oracle for O2NC"),
    "fo_spider": EstimatorTraits(NONSMOOTH, False, DENSE, False, False, True, False, "first-order SPIDER oracle for O2NC"),
    "zo_naive": EstimatorTraits(NONSMOOTH, False, DENSE, False, True, False, False, "one-shot zeroth-order oracle for O2NC"),
    "full_gradient": EstimatorTraits(KL, False, DENSE, False, False, False, False, "full-batch gradient (KL optimizers)"),
}


@dataclass(frozen=True)
class MechanismTraits:
    families: Tuple[str, ...]  # the families whose estimators it can release
    private: bool              # False: a non-private twin (epsilon = inf)
    stateful: bool             # keeps un-noised running sums in the process (never checkpointed or logged)
    secure_noise: bool         # privacy.noise: secure is available


MECHANISMS: Dict[str, MechanismTraits] = {
    #                                  families             private stateful secure-noise
    "gaussian": MechanismTraits((STANDARD, NONSMOOTH), True, False, True),
    "tree_aggregation": MechanismTraits((NONSMOOTH,), True, True, False),
    "scheduled_gaussian": MechanismTraits((NONSMOOTH,), True, False, True),
    "planned_gaussian": MechanismTraits((KL,), True, False, False),
    "adaptive_gaussian": MechanismTraits((KL,), True, False, False),
    "none": MechanismTraits(FAMILIES, False, False, False),
}


@dataclass(frozen=True)
class OptimizerTraits:
    family: str
    plans_steps: bool  # a theory preset may derive the steps (no epochs needed)


OPTIMIZERS: Dict[str, OptimizerTraits] = {
    "sgd": OptimizerTraits(STANDARD, False),
    "adam": OptimizerTraits(STANDARD, False),
    "o2nc": OptimizerTraits(NONSMOOTH, True),
    "kl_spider": OptimizerTraits(KL, True),
    "proximal_point": OptimizerTraits(KL, True),
    "adaptive_noisy_gd": OptimizerTraits(KL, True),
}


@dataclass(frozen=True)
class SamplerTraits:
    subsampled: bool   # a batch is a secret random subset (amplification by subsampling)
    every_row: bool    # every private row in every step
    multi_pass: bool   # the improved nonsmooth algorithm's multi-pass schedule can run on it
    single_pass: bool  # each row read at most once


SAMPLERS: Dict[str, SamplerTraits] = {
    #                              subsampled every-row multi-pass single-pass
    "poisson": SamplerTraits(True, False, True, False),
    "fixed_size": SamplerTraits(True, False, False, False),
    "full_batch": SamplerTraits(False, True, True, False),
    "single_pass": SamplerTraits(False, False, False, True),
}


@dataclass(frozen=True)
class ModelTraits:
    reads: str          # "numbers" (feature vectors, pixels), "tokens" (token ids) or "objective" (no rows)
    pretrained: bool    # weights come from a package or folder; only a head is drawn from the seed
    sized_from_shapes: bool  # its dimension is known before any weight is loaded


MODELS: Dict[str, ModelTraits] = {
    #                          reads    pretrained sized-from-shapes
    "linear": ModelTraits("numbers", False, True),
    "mlp": ModelTraits("numbers", False, True),
    "cnn": ModelTraits("numbers", False, True),
    "hf": ModelTraits("tokens", True, False),
    "causal_lm": ModelTraits("tokens", True, False),
    "masked_lm": ModelTraits("tokens", True, False),
    "objective": ModelTraits("objective", False, True),
}


@dataclass(frozen=True)
class SourceTraits:
    # "numbers", "tokens", "numbers_or_tokens" (a file with or without a text column), "completions" (a causal LM's
    # prompt and completion tokens), "objective"
    rows: str
    known_range: Optional[bool]  # pixel values of a known range (scale: fixed); None: decided by the source's name
    packaged: bool             # ships inside a Python package (checked without importing it)
    columns: bool              # rows of named columns (label, features or text, row_id: specs' ColumnsSource)
    windowed: bool             # reads only a run's window of data.blocks, given its bounds (a database's WHERE)


SOURCES: Dict[str, SourceTraits] = {
    #                                  rows       known-range packaged columns windowed
    "sklearn": SourceTraits("numbers", None, True, False, False),
    "text": SourceTraits("tokens", False, True, False, False),
    "file": SourceTraits("numbers_or_tokens", False, False, True, False),
    "completions": SourceTraits("completions", False, False, False, False),
    "images": SourceTraits("numbers", True, False, False, False),
    "packaged_images": SourceTraits("numbers", True, True, False, False),
    "synthetic": SourceTraits("objective", False, False, False, False),
    "sql": SourceTraits("numbers_or_tokens", False, False, True, True),
}
# the kinds of rows of named columns, as refusals name them ("file or sql")
COLUMN_SOURCES = " or ".join(kind for kind, traits in SOURCES.items() if traits.columns)


def has_columns(source) -> bool:
    """A source of rows of named columns (a file, a table)."""
    return SOURCES[source.kind].columns


def reads_by_window(source) -> bool:
    """A source a run on blocks hands its window's bounds, so only the window's rows are read."""
    return SOURCES[source.kind].windowed


def reads_text(source) -> bool:
    """A file or table source whose input is a text column (token ids), not numeric features."""
    return has_columns(source) and source.text is not None


# sklearn sources whose values have a known range (8x8 digits, pixel counts 0..16)
KNOWN_RANGE_SKLEARN: FrozenSet[str] = frozenset({"digits"})


@dataclass(frozen=True)
class SplitTraits:
    public_rows: str  # "fraction" (a share of the source), "column" (flagged by the data owner), "source" (another source)


SPLITS: Dict[str, SplitTraits] = {
    "fraction": SplitTraits("fraction"),
    "hashed": SplitTraits("fraction"),
    "column": SplitTraits("column"),
    "source": SplitTraits("source"),
}

# the synthetic problems (data.source.kind synthetic) and the family whose theory they were made for
PROBLEMS: Dict[str, str] = {
    "w_linear": NONSMOOTH,
    "mean_pl": KL,
    "quartic_balanced": KL,
    "pl_sine": KL,
    "abs_three_halves": KL,
    "logistic_nonconvex": KL,
}

# every traits table, by the RunSpec field path whose ``kind`` selects its row
TABLES = {
    "estimator": ESTIMATORS,
    "mechanism": MECHANISMS,
    "optimizer": OPTIMIZERS,
    "sampling": SAMPLERS,
    "model": MODELS,
    "data.source": SOURCES,
    "data.split": SPLITS,
}


def kinds(table: Dict[str, object], **where) -> Tuple[str, ...]:
    """The kinds of ``table`` whose traits match every ``field=value`` given, in table order."""
    return tuple(kind for kind, row in table.items() if all(getattr(row, f) == v for f, v in where.items()))


def family_of(spec) -> str:
    """A run's family, chosen once from its spec: the optimizer's (the rules refuse an estimator or mechanism
    of another family)."""
    return OPTIMIZERS[spec.optimizer.kind].family


def known_range(source) -> bool:
    """Whether a source's values have a known range (scale: fixed, and auto scaling skips standardising)."""
    row = SOURCES[source.kind]
    if row.known_range is None:
        return source.name in KNOWN_RANGE_SKLEARN
    return row.known_range


# Derived sets, for rules that name a group of kinds (computed from the rows above, never restated)
RUNNING_SUM_ESTIMATORS = kinds(ESTIMATORS, running_sums=True)      # zo_spider, fo_spider
NONSMOOTH_ESTIMATORS = kinds(ESTIMATORS, family=NONSMOOTH)         # O2NC's oracles
SEEDED_DIRECTION_ESTIMATORS = kinds(ESTIMATORS, seeded_directions=True)
# Whose journal of (seed, coefficient) steps is the whole trajectory: scalars along seeded directions, no public
# rows inside a step, applied by sgd (components.optimizers.replay). privzo verify replays their weights, and
# only they may register a transcript (tracking.register_as).
JOURNAL_ESTIMATORS = kinds(ESTIMATORS, seeded_directions=True, release=SCALAR, uses_public=False)  # two_point
JOURNAL_OPTIMIZERS = ("sgd",)
MULTI_PASS_SAMPLERS = kinds(SAMPLERS, multi_pass=True)
KL_OPTIMIZERS = kinds(OPTIMIZERS, family=KL)
KL_PROBLEMS = tuple(problem for problem, family in PROBLEMS.items() if family == KL)
