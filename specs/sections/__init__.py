"""The sections of a run spec, one module per section, one discriminated union on ``kind`` per component kind.

Names follow shared vocabulary: ``privacy.epsilon`` is only ever the DP epsilon; the zeroth-order
perturbation scale is ``smoothing`` (lambda); sigma is ``noise_multiplier``; C is ``clip``; q is
``queries``. Every public name is re-exported here, so ``from specs.sections import X`` works whichever
module defines X. The modules import only ``specs.base``, never one another.
"""
from specs.base import Probability
from specs.sections.data import (
    SklearnSource, TextSource, FileSource, CompletionsSource, ImageFolderSource, PackagedImagesSource, SyntheticSource, SqlSource,
    Source,
    FractionSplit, HashedSplit, ColumnSplit, SourceSplit, Split, BlocksSpec, DataSpec,
)
from specs.sections.model import (
    LinearModel, MlpModel, CnnModel, LoraSpec, HfModel, CausalLabelWords, MaskedLabelWords, CompletionPrompt, CausalLmModel,
    MaskedLmModel, ObjectiveModel, ModelSpec,
)
from specs.sections.estimator import (
    PublicWarmStart, TwoPointEstimator, DpgdZerothEstimator, PazoMEstimator, PazoPEstimator, PazoSEstimator,
    FirstOrderEstimator, GepEstimator, DopeSgdEstimator, PdaDpmdEstimator, ZoSpiderEstimator, FoSpiderEstimator,
    ZoNaiveEstimator, FullGradientEstimator, EstimatorSpec,
)
from specs.sections.mechanism import (
    GaussianMechanism, TreeAggregationMechanism, ScheduledGaussianMechanism, PlannedGaussianMechanism,
    AdaptiveGaussianMechanism, NoMechanism, MechanismSpec,
)
from specs.sections.privacy import PrivacySpec
from specs.sections.sampling import (
    PoissonSampling, FixedSizeSampling, FullBatchSampling, SinglePassSampling, SamplingSpec, batch_size_of,
)
from specs.sections.optimizer import (
    SgdOptimizer, AdamOptimizer, O2NC_CONSTANTS, O2ncOptimizer, KL_CONSTANTS, KlSpiderOptimizer,
    ProximalPointOptimizer, AdaptiveNoisyGdOptimizer, OptimizerSpec,
)
from specs.sections.assumptions import KlSpec, AssumptionsSpec
from specs.sections.execution import ExecutionSpec
from specs.sections.tracking import TRACKING_URI_ENV, tracking_uri_from_env, TrackingSpec
from specs.sections.checkpoint import CheckpointSpec
from specs.sections.budget import (
    DATASET_PATTERN, LEDGER_URL_ENV, ledger_from_env, WindowSpec, BudgetSpec, default_ledger, sqlite_ledger_problem,
)
from specs.sections.tune import REPEAT_KINDS, RepeatSpec, ScoreSpec, TuneSpec

__all__ = [
    "Probability", "SklearnSource", "TextSource", "FileSource", "SqlSource", "CompletionsSource", "ImageFolderSource",
    "PackagedImagesSource",
    "SyntheticSource", "Source", "FractionSplit", "HashedSplit", "ColumnSplit", "SourceSplit", "Split", "BlocksSpec",
    "DataSpec",
    "LinearModel", "MlpModel", "CnnModel", "LoraSpec", "HfModel", "CausalLabelWords", "MaskedLabelWords",
    "CompletionPrompt", "CausalLmModel", "MaskedLmModel", "ObjectiveModel", "ModelSpec", "PublicWarmStart",
    "TwoPointEstimator", "DpgdZerothEstimator", "PazoMEstimator", "PazoPEstimator", "PazoSEstimator",
    "FirstOrderEstimator", "GepEstimator", "DopeSgdEstimator", "PdaDpmdEstimator", "ZoSpiderEstimator",
    "FoSpiderEstimator", "ZoNaiveEstimator", "FullGradientEstimator", "EstimatorSpec", "GaussianMechanism",
    "TreeAggregationMechanism", "ScheduledGaussianMechanism", "PlannedGaussianMechanism", "AdaptiveGaussianMechanism",
    "NoMechanism", "MechanismSpec", "PrivacySpec", "PoissonSampling", "FixedSizeSampling", "FullBatchSampling",
    "SinglePassSampling", "SamplingSpec", "batch_size_of", "SgdOptimizer", "AdamOptimizer", "O2NC_CONSTANTS",
    "O2ncOptimizer", "KL_CONSTANTS", "KlSpiderOptimizer", "ProximalPointOptimizer", "AdaptiveNoisyGdOptimizer",
    "OptimizerSpec", "KlSpec", "AssumptionsSpec", "ExecutionSpec", "TRACKING_URI_ENV", "tracking_uri_from_env",
    "TrackingSpec", "CheckpointSpec", "DATASET_PATTERN", "LEDGER_URL_ENV", "ledger_from_env", "WindowSpec", "BudgetSpec",
    "default_ledger", "sqlite_ledger_problem", "REPEAT_KINDS", "RepeatSpec", "ScoreSpec", "TuneSpec",
]
