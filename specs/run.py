"""The whole run: one typed spec, validated per field and then by cross-field rules."""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

from pydantic import Field, model_validator

from specs.base import Strict
from specs.sections import (
    AssumptionsSpec,
    DataSpec,
    EstimatorSpec,
    ExecutionSpec,
    MechanismSpec,
    ModelSpec,
    OptimizerSpec,
    PrivacySpec,
    SamplingSpec,
    BudgetSpec,
    CheckpointSpec,
    TrackingSpec,
    batch_size_of,
)


NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"

class RunSpec(Strict):
    name: str = Field(..., pattern=NAME_PATTERN, description="Run and experiment name.")
    seed: int = Field(0, ge=0, description="Public randomness only (directions, splits); never DP noise.")
    data: DataSpec
    model: ModelSpec
    estimator: EstimatorSpec
    mechanism: MechanismSpec
    privacy: Optional[PrivacySpec] = Field(None, description="Required unless mechanism.kind is none.")
    sampling: SamplingSpec
    optimizer: OptimizerSpec
    execution: ExecutionSpec = ExecutionSpec()
    tracking: TrackingSpec = TrackingSpec()
    checkpoint: CheckpointSpec = CheckpointSpec()
    budget: Optional[BudgetSpec] = None
    assumptions: Optional[AssumptionsSpec] = Field(None, description="What a theory preset assumes of the loss.")

    @model_validator(mode="after")
    def _cross_field(self) -> "RunSpec":
        problems = cross_field_problems(self)
        if problems:
            raise ValueError(" | ".join(problems))
        return self

    # ------------------------------------------------------------ resolution
    @property
    def private(self) -> bool:
        """True when the run is meant to be differentially private (and not insecure_deterministic)."""
        return self.mechanism.kind != "none" and not self.privacy.insecure_deterministic

    @property
    def is_resolved(self) -> bool:
        values = [self.optimizer.steps]
        if self.mechanism.kind != "none":
            values += [self.privacy.delta, self.mechanism.noise_multiplier, self.mechanism.clip]
        if self.optimizer.kind == "o2nc":
            values += [self.optimizer.step_bound, self.optimizer.lr, self.optimizer.window, self.optimizer.restart]
        if self.optimizer.kind == "adaptive_noisy_gd":
            values += [self.optimizer.lr]
        if self.sampling.kind == "single_pass":
            values += [self.sampling.start_batch, self.sampling.period]
        if self.estimator.kind in SPIDER_KINDS:
            values += [self.estimator.start_directions, self.estimator.directions]
            if self.sampling.kind in MULTI_PASS_SAMPLING:
                values += [self.estimator.period]
        if self.mechanism.kind in ("tree_aggregation", "scheduled_gaussian"):
            values += [self.mechanism.difference_clip]
        if self.mechanism.kind == "scheduled_gaussian":
            values += [self.mechanism.difference_noise_multiplier]
        return "auto" not in values

    @property
    def private_count_is_public(self) -> bool:
        """Whether the run may use (and so releases) the number of private rows: under replace-one
        neighbours it is the same for every neighbouring dataset, and a run without privacy protects
        nothing. Under add/remove it is private, and ``data.declared_private_rows`` stands in for it."""
        return self.privacy is None or self.privacy.neighboring == "replace_one"

    def public_rows(self, n_private: Optional[int] = None) -> int:
        """N, the row count every derived constant comes from (sampling rate, steps from epochs, delta auto,
        a full batch's normaliser): the declared count where the spec gives one, else the private count
        where that is public. Never the private count of an add/remove run."""
        declared = self.data.declared_private_rows
        if declared is not None:
            if self.privacy is not None and self.privacy.neighboring == "replace_one" and n_private not in (None, declared):
                # replace-one neighbours share the count, so it is public and the run draws from all n rows
                raise ValueError(f"data.declared_private_rows: {declared}, but the split has {n_private} private rows; "
                                 "under neighboring replace_one the count is public and used exactly: correct it or "
                                 "remove it")
            return int(declared)
        if not self.private_count_is_public:
            raise ValueError("data.declared_private_rows: required under privacy.neighboring add_remove "
                             "(the private row count must not set the run's constants)")
        if n_private is None:
            raise ValueError("public_rows: this spec takes its constants from the private row count; pass it")
        return n_private

    def planned_steps(self, n_private: Optional[int] = None) -> int:
        """Number of private steps: explicit ``steps`` or ceil(epochs * N / batch), N = public_rows(n_private)."""
        if self.optimizer.steps != "auto":
            return int(self.optimizer.steps)
        assert self.optimizer.epochs is not None  # guaranteed by the cross-field rules
        rows = self.public_rows(n_private)
        return max(1, math.ceil(self.optimizer.epochs * rows / self.batch_size(rows)))

    def batch_size(self, n_private: Optional[int] = None) -> int:
        """Rows in a step (expected, for Poisson sampling); a full batch is N = public_rows(n_private)."""
        if self.sampling.kind != "full_batch":
            return batch_size_of(self.sampling, 0)
        return self.public_rows(n_private)

    def delta_for(self, n_private: Optional[int] = None) -> float:
        """delta auto = 1 / N, N = public_rows(n_private); an explicit delta above 1/N is refused (delta_problem)."""
        problem = self.delta_problem(n_private)
        if problem:
            raise ValueError(problem)
        return 1.0 / self.public_rows(n_private) if self.privacy.delta == "auto" else float(self.privacy.delta)

    def delta_problem(self, n_private: Optional[int] = None) -> Optional[str]:
        """Why an explicit delta above 1/N (N = public_rows(n_private)) is refused, unless
        privacy.allow_large_delta: a mechanism that publishes one random row whole is (0, 1/N)-DP, so such a
        delta promises nothing of any one row. 1/N itself, delta auto, is accepted."""
        if self.privacy is None or self.privacy.delta == "auto" or self.privacy.allow_large_delta:
            return None
        rows = self.public_rows(n_private)
        delta = float(self.privacy.delta)
        if delta <= 1.0 / rows:
            return None
        who = "data.declared_private_rows" if self.data.declared_private_rows is not None else "the private rows"
        smaller = 10.0 ** (math.floor(math.log10(1.0 / rows)) - 1)
        return (f"privacy.delta: {delta!r} is above 1/N = 1/{rows} = {1.0 / rows:.6g} (N: {who}): not a meaningful "
                f"guarantee (publishing one random row whole meets it); use delta: auto (1/N) or smaller, e.g. "
                f"{smaller:g}, or set privacy.allow_large_delta: true to run anyway (the run is labelled)")

    def large_delta(self, n_private: Optional[int] = None) -> bool:
        """Whether the run's delta is above 1/N (N = public_rows(n_private)), which only
        privacy.allow_large_delta lets run: its guarantee must say so wherever it is recorded. A resolved
        spec's delta is a number (auto became exactly 1/N, which is not above it)."""
        if self.privacy is None or self.privacy.delta == "auto" or not self.privacy.allow_large_delta:
            return False
        return float(self.privacy.delta) > 1.0 / self.public_rows(n_private)

    def resolved(self, *, n_private: Optional[int] = None, noise_multiplier: Optional[float],
                 filled: Optional[Dict[str, Dict[str, Any]]] = None) -> "RunSpec":
        """The spec with every ``auto`` replaced; this is what a run logs and replays. ``n_private`` is used
        only where the private count is public (public_rows). ``filled``: values a preset derived, by
        section and field."""
        data: Dict[str, Any] = self.model_dump(mode="json")
        for section, values in (filled or {}).items():
            data[section] = {**(data.get(section) or {}), **values}
        if self.mechanism.kind != "none":
            data["privacy"]["delta"] = self.delta_for(n_private)
            data["mechanism"]["noise_multiplier"] = noise_multiplier
            if data["estimator"]["kind"] == "gep" and data["estimator"].get("residual_clip") is None:
                data["estimator"]["residual_clip"] = self.mechanism.clip  # logged as the number it bounds with
        # epochs are a request; the resolved run is a fixed number of steps
        if data["optimizer"]["steps"] == "auto":
            data["optimizer"]["steps"] = self.planned_steps(n_private)
        data["optimizer"]["epochs"] = None
        return RunSpec.model_validate(data)


def cross_field_problems(spec: RunSpec) -> List[str]:
    """Rules that involve more than one field; each message names its fields and the fix."""
    problems: List[str] = []
    opt = spec.optimizer
    theory = (opt.kind == "o2nc" and opt.preset != "manual") or opt.kind in KL_KINDS
    if opt.steps == "auto" and opt.epochs is None and not theory:
        problems.append("optimizer: give epochs or steps (steps: auto needs epochs)")
    if opt.kind == "o2nc" and opt.epochs is not None:
        problems.append("optimizer.epochs: o2nc runs a single pass; give steps, or steps: auto with preset: theory")
    if opt.kind in KL_KINDS and opt.epochs is not None:
        problems.append(f"optimizer.epochs: {opt.kind} plans its own releases from the theorem; remove epochs "
                        "(steps: auto)")
    if opt.steps != "auto" and opt.epochs is not None:
        problems.append("optimizer: give one of epochs or steps, not both")
    if spec.mechanism.kind == "none" and spec.privacy is not None:
        problems.append("privacy: mechanism.kind none trains without privacy; remove the privacy section")
    if spec.mechanism.kind != "none" and spec.privacy is None:
        problems.append("privacy: required key is missing (epsilon, delta, accountant, neighboring)")
        return problems
    if spec.privacy is not None and spec.privacy.allow_large_delta and spec.privacy.delta == "auto":
        problems.append("privacy.allow_large_delta: delta auto is 1/N, never above it; remove allow_large_delta")
    if spec.privacy is not None and spec.data.declared_private_rows is not None:
        # N is public here, so the spec alone is refused; otherwise (replace_one) when its rows are counted
        problem = spec.delta_problem()
        if problem:
            problems.append(problem)
    if spec.budget is not None and not (spec.privacy and not spec.privacy.insecure_deterministic):
        problems.append("budget: only private runs are charged to a dataset's budget; remove budget")
    if spec.budget is not None and spec.privacy is not None and spec.privacy.epsilon > spec.budget.lifetime_epsilon:
        problems.append("privacy.epsilon: larger than budget.lifetime_epsilon; lower it or raise the budget")
    if spec.privacy is not None and spec.privacy.neighboring == "replace_one" and spec.sampling.kind == "poisson":
        problems.append(
            "privacy.neighboring: replace_one is not accounted for poisson sampling; use add_remove "
            "with sampling.kind: poisson, or sampling.kind: fixed_size or full_batch"
        )
    if spec.privacy is not None and spec.sampling.kind == "full_batch" and spec.privacy.neighboring != "replace_one":
        # a full-batch step is normalised by the number of rows, which add/remove neighbours change
        problems.append("privacy.neighboring: sampling.kind full_batch divides by the number of private rows, "
                        "which add/remove neighbours change; set neighboring: replace_one")
    if spec.privacy is not None and spec.sampling.kind == "fixed_size":
        if spec.privacy.neighboring != "replace_one":
            problems.append("privacy.neighboring: sampling.kind fixed_size is accounted under replace_one only "
                            "(its batch size is public); set neighboring: replace_one or use sampling.kind: poisson")
        if spec.privacy.accountant != "rdp":
            problems.append(f"privacy.accountant: {spec.privacy.accountant} has no accounting for sampling without "
                            "replacement (sampling.kind fixed_size); use accountant: rdp")
    if spec.privacy is not None and spec.privacy.accountant == "zcdp" and spec.sampling.kind == "poisson":
        # fixed_size is refused above; zCDP has no tight bound for any subsampled step
        problems.append("privacy.accountant: zcdp has no bound for Poisson-subsampled steps; use rdp or pld, "
                        "or sampling.kind: full_batch with neighboring: replace_one")
    declared = spec.data.declared_private_rows
    if (spec.privacy is not None and spec.privacy.neighboring == "add_remove" and spec.sampling.kind == "poisson"
            and declared is None):
        problems.append("data.declared_private_rows: required with neighboring add_remove: Poisson's rate "
                        "expected_batch_size / N, steps from epochs and delta auto must not move with an added or "
                        "removed row; declare N, a public figure for the number of private rows")
    if declared is not None and spec.sampling.kind == "poisson" and spec.sampling.expected_batch_size > declared:
        problems.append(f"sampling.expected_batch_size: {spec.sampling.expected_batch_size} is more than "
                        f"data.declared_private_rows {declared}; the rate expected_batch_size / N must be at most 1")
    est = spec.estimator
    split = spec.data.split
    problems += nonsmooth_problems(spec)
    problems += kl_problems(spec)
    if est.kind not in O2NC_KINDS and getattr(est, "radius", "auto") != "auto" and est.directions != "sphere":
        problems.append("estimator.radius: only used with directions: sphere; remove it or set directions: sphere")
    ex = spec.execution
    if ex.backend == "ray" and ex.device == "cuda" and ex.gpus_per_worker == 0:
        problems.append("execution.device: cuda with backend ray needs gpus_per_worker > 0 (workers draw the "
                        "driver's directions on the same kind of device); set gpus_per_worker or device: cpu")
    if ex.workers_per_node is not None and ex.workers % ex.workers_per_node:
        problems.append(f"execution.workers_per_node: {ex.workers_per_node} does not divide execution.workers "
                        f"({ex.workers}); workers are placed as workers / workers_per_node whole nodes")
    if spec.execution.prefetch_directions:
        if est.kind in ("pazo_p", "pazo_s", "first_order") + PUBLIC_FIRST_ORDER_KINDS + O2NC_KINDS:
            problems.append(f"execution.prefetch_directions: {est.kind} has no seeded directions to draw ahead; "
                            "remove it (two_point, dpgd_0th and pazo_m use it)")
        elif est.perturbation == "regenerate":
            problems.append("execution.prefetch_directions: needs cached directions; set estimator.perturbation "
                            "to cache or auto, or remove prefetch_directions")
    opt = spec.optimizer
    if est.kind == "pazo_s" and (opt.kind != "sgd" or opt.momentum or opt.weight_decay):
        field = "optimizer.kind" if opt.kind != "sgd" else "optimizer.momentum" if opt.momentum else \
            "optimizer.weight_decay"
        problems.append(f"{field}: pazo_s steps to the candidate it scored, x - lr * g, which only sgd without "
                        "momentum or weight decay reaches; use optimizer: {kind: sgd} with neither")
    if (est.kind.startswith("pazo") or est.kind in PUBLIC_FIRST_ORDER_KINDS) and not split.has_public:
        problems.append(f"estimator.kind: {est.kind} uses public data; set data.split.public > 0")
    if getattr(est, "public_warm_start", None) is not None and not split.has_public:
        problems.append("estimator.public_warm_start: needs public data; set data.split.public > 0")
    if split.kind in ("fraction", "hashed"):
        if split.imbalance is not None and split.public == 0.0:
            problems.append("data.split.imbalance: needs a public fraction > 0")
        if split.test == 0 and spec.data.source.kind != "synthetic":
            problems.append("data.split.test: 0 leaves nothing to evaluate on; only a synthetic source (exact "
                            "evaluation) may hold no test rows")
        if split.public > 0 and split.test + split.public * (1 - split.test) >= 1.0:
            problems.append("data.split: public and test fractions leave no private rows")
    source = spec.data.source
    if split.kind == "column" and source.kind != "file":
        problems.append("data.split.kind: column reads a column of a file source; use data.source.kind: file")
    if split.kind == "column" and source.kind == "file":
        if split.column == source.label or (source.features is not None and split.column in source.features):
            problems.append(f"data.split.column: {split.column!r} is the label or a feature; name the column "
                            "that flags public rows")
        if split.column == source.text:
            problems.append(f"data.split.column: {split.column!r} is the text column")
    if split.kind == "source":
        problems += _public_source_problems(source, split.public_source)
    file_text = source.kind == "file" and source.text is not None
    text, hf = source.kind == "text" or file_text, spec.model.kind == "hf"
    if hf and not text:
        problems.append("model.kind: hf reads token ids; use data.source.kind: text, or a file source with a "
                        "text column")
    if file_text and source.text == source.label:
        problems.append("data.source.text: the label column cannot also be the text")
    if text and hf and source.tokenizer not in (None, spec.model.weights):
        problems.append(f"data.source.tokenizer: {source.tokenizer!r} is not the model's ({spec.model.weights!r}); "
                        "the ids must index the model's own vocabulary")
    if text and not hf:
        field = "data.source.text" if file_text else "data.source.kind: text"
        problems.append(f"{field} gives token ids, which model.kind {spec.model.kind} cannot read; use model.kind: hf")
    # 'auto' standardises with the public rows, except pixels of a known range (digits, images) and text (ids)
    known_range = (source.kind == "sklearn" and source.name == "digits") or source.kind in ("images", "packaged_images")
    scale = getattr(source, "scale", "none")
    if scale == "fixed" and not known_range:
        problems.append("data.source.scale: fixed is only known for digits and images; use public or none")
    if not file_text and (scale == "public" or (scale == "auto" and not known_range)) and not split.has_public:
        problems.append("data.source.scale: public standardisation needs data.split.public > 0; set scale: none")
    return problems


SPIDER_KINDS = ("zo_spider", "fo_spider")  # increments released by tree aggregation
O2NC_KINDS = ("zo_spider", "fo_spider", "zo_naive")  # the nonsmooth oracles (O2NC's query points)
# first order guided by public data (the PAZO paper's FO+PUB baselines): one public gradient batch a step
PUBLIC_FIRST_ORDER_KINDS = ("gep", "dope_sgd", "pda_dpmd")
# paper 002's multi-pass algorithm: every row in every step, or a Poisson batch a step (its footnote 2)
MULTI_PASS_SAMPLING = ("full_batch", "poisson")


KL_KINDS = ("kl_spider", "proximal_point", "adaptive_noisy_gd")  # paper 003's optimizers
KL_PROBLEMS = ("mean_pl", "quartic_balanced", "pl_sine", "abs_three_halves", "logistic_nonconvex")
# what each optimizer's preset reads of the assumptions (a synthetic KL problem knows its own)
KL_ASSUMPTIONS = {"kl_spider": ("lipschitz", "smoothness", "initial_gap", "kl"),
                  "proximal_point": ("lipschitz", "weak_convexity", "initial_gap", "kl"),
                  "adaptive_noisy_gd": ("lipschitz", "smoothness")}


def kl_problems(spec: RunSpec) -> List[str]:
    """The rules of paper 003's algorithms (full-batch first order under replace-one, zCDP-style accounting)."""
    problems: List[str] = []
    est, mech, sampling, opt = spec.estimator, spec.mechanism, spec.sampling, spec.optimizer
    source = spec.data.source
    kl_opt = opt.kind in KL_KINDS
    if (est.kind == "full_gradient") != kl_opt:
        problems.append("estimator.kind: full_gradient and the optimizers kl_spider, proximal_point and "
                        "adaptive_noisy_gd go together (they plan its releases)")
    if not kl_opt:
        if mech.kind in ("planned_gaussian", "adaptive_gaussian"):
            problems.append(f"mechanism.kind: {mech.kind} releases paper 003's optimizers (kl_spider, "
                            "proximal_point, adaptive_noisy_gd); use gaussian")
        if source.kind == "synthetic" and source.problem in KL_PROBLEMS and opt.kind == "o2nc":
            problems.append(f"data.source.problem: {source.problem} is paper 003's; o2nc's presets know w_linear only")
        return problems
    if sampling.kind != "full_batch":
        problems.append(f"sampling.kind: {opt.kind} reads every private row every step; use full_batch")
    wanted = "adaptive_gaussian" if opt.kind == "adaptive_noisy_gd" else "planned_gaussian"
    if mech.kind != wanted:
        problems.append(f"mechanism.kind: {opt.kind} releases by {wanted} (its schedule is planned from the privacy "
                        f"budget), not {mech.kind}")
    if source.kind == "synthetic" and source.problem not in KL_PROBLEMS:
        problems.append(f"data.source.problem: {opt.kind} needs a smooth or weakly convex problem; use one of "
                        f"{', '.join(KL_PROBLEMS)}")
    if spec.privacy is not None and spec.privacy.noise == "secure":
        problems.append(f"privacy.noise: secure is not available with {opt.kind} yet; use fast or auto")
    accountant = spec.privacy.accountant if spec.privacy is not None else None
    if accountant == "pld" and mech.kind == "adaptive_gaussian" and (
            mech.filter == "zcdp" or getattr(opt, "select", "last") == "exponential"):
        why = "the zcdp filter" if mech.filter == "zcdp" else "the exponential-mechanism selection"
        problems.append(f"privacy.accountant: pld has no form for {why} (a zCDP event); use rdp or zcdp")
    if source.kind != "synthetic" or source.problem not in KL_PROBLEMS:
        given = spec.assumptions
        missing = [name for name in KL_ASSUMPTIONS[opt.kind]
                   if given is None or getattr(given, name) in ("auto", None)]
        if missing:
            problems.append(f"assumptions.{missing[0]}: {opt.kind}'s preset needs "
                            f"{', '.join(KL_ASSUMPTIONS[opt.kind])} (a synthetic KL problem knows its own)")
    kl = spec.assumptions.kl if spec.assumptions is not None else None
    if kl is not None and opt.kind == "kl_spider" and not 1.0 <= kl.kappa <= 2.0:
        problems.append(f"assumptions.kl.kappa: kl_spider is for kappa in [1, 2], not {kl.kappa:g}; use "
                        "proximal_point for kappa >= 2")
    if kl is not None and opt.kind == "proximal_point" and kl.kappa < 2.0:
        problems.append(f"assumptions.kl.kappa: proximal_point is for kappa >= 2, not {kl.kappa:g}; use kl_spider")
    if source.kind == "synthetic" and source.problem in KL_PROBLEMS:
        split = spec.data.split
        if split.kind != "fraction" or split.public != 0 or split.test != 0:
            problems.append("data.split: a KL problem's risk is over every simulated row (its closed-form "
                            "minimiser); use {kind: fraction, public: 0, test: 0}")
    return problems


def nonsmooth_problems(spec: RunSpec) -> List[str]:
    """The rules of the private nonsmooth algorithms (O2NC with zeroth-order oracles, papers 001 and 002)."""
    problems: List[str] = []
    est, mech, sampling, opt = spec.estimator, spec.mechanism, spec.sampling, spec.optimizer
    source, model = spec.data.source, spec.model
    if (source.kind == "synthetic") != (model.kind == "objective"):
        problems.append("model.kind: objective is the parameter vector of a synthetic problem; use it exactly with "
                        "data.source.kind: synthetic")
    if mech.kind == "tree_aggregation":
        if sampling.kind != "single_pass":
            # Poisson or fixed-size batches can put one row in two leaves of a tree, multiplying its node
            # sensitivity; dp-accounting has no event for amplified tree aggregation
            problems.append(f"sampling.kind: {sampling.kind} can put a row in several leaves of one tree, which "
                            "tree_aggregation does not account for; use sampling.kind: single_pass")
        if est.kind not in SPIDER_KINDS:
            problems.append(f"mechanism.kind: tree_aggregation releases running sums of zo_spider's or fo_spider's "
                            f"increments; "
                            f"estimator.kind {est.kind} is released by gaussian")
        if spec.privacy is not None and spec.privacy.noise == "secure":
            problems.append("privacy.noise: secure is not available with tree_aggregation yet; use fast or auto")
    multi_pass = est.kind in SPIDER_KINDS and sampling.kind in MULTI_PASS_SAMPLING
    if est.kind in SPIDER_KINDS and not multi_pass and mech.kind not in ("tree_aggregation", "none"):
        problems.append(f"mechanism.kind: {est.kind}'s increments are released by tree_aggregation (or none, a "
                        f"non-private twin), not {mech.kind}")
    if multi_pass and mech.kind not in ("scheduled_gaussian", "none"):
        problems.append(f"mechanism.kind: {est.kind} over {sampling.kind} batches (paper 002's multi-pass algorithm) "
                        f"releases by scheduled_gaussian (or none, a non-private twin), not {mech.kind}")
    if mech.kind == "scheduled_gaussian" and not multi_pass:
        problems.append("mechanism.kind: scheduled_gaussian is paper 002's multi-pass release; it needs estimator "
                        "zo_spider (variant 002) or fo_spider with sampling.kind: full_batch (or poisson, its "
                        "footnote 2)")
    if mech.kind == "scheduled_gaussian" and (mech.noise_multiplier == "auto") != (
            mech.difference_noise_multiplier == "auto"):
        problems.append("mechanism.difference_noise_multiplier: give both multipliers, or neither (auto: the paper's "
                        "ratio, one scale calibrated)")
    if multi_pass and getattr(est, "variant", None) == "001":
        problems.append(f"estimator.variant: the multi-pass algorithm (sampling.kind {sampling.kind}) is paper 002's; "
                        "use variant: \"002\"")
    if getattr(est, "period", None) is not None and not multi_pass:
        problems.append("estimator.period: only for the multi-pass algorithm (sampling.kind: full_batch or poisson); a single "
                        "pass takes sampling.period")
    if multi_pass and opt.kind == "o2nc" and opt.preset != "manual" and opt.target_stationarity is None:
        problems.append("optimizer.target_stationarity: paper 002's multi-pass preset is planned for a target "
                        "beta (Theorem 4.1); give one, e.g. 0.5")
    if est.kind == "zo_naive" and mech.kind not in ("gaussian", "none"):
        problems.append(f"mechanism.kind: zo_naive releases one Gaussian vector a step; use gaussian, not {mech.kind}")
    if (est.kind in O2NC_KINDS) != (opt.kind == "o2nc"):
        problems.append("optimizer.kind: o2nc and the estimators zo_spider, fo_spider and zo_naive go together (the oracles "
                        "read O2NC's query points; O2NC needs their unbiased smoothed gradients)")
    if sampling.kind == "single_pass":
        if est.kind not in O2NC_KINDS:
            problems.append(f"sampling.kind: single_pass is for zo_spider, fo_spider and zo_naive, not {est.kind}")
        if spec.privacy is not None and spec.privacy.neighboring != "replace_one":
            problems.append("privacy.neighboring: single_pass batches are a fixed partition of the rows, which an "
                            "added row would shift; set neighboring: replace_one")
        if est.kind == "zo_naive" and sampling.period not in ("auto", 1):
            problems.append("sampling.period: zo_naive has no tree; set period: 1 (or auto)")
    elif est.kind in O2NC_KINDS and not multi_pass:
        problems.append(f"sampling.kind: {est.kind} reads each row once; use sampling.kind: single_pass"
                        + (" (or full_batch or poisson: paper 002's multi-pass algorithm)" if est.kind in SPIDER_KINDS
                           else ""))
    if opt.kind == "o2nc":
        autos = [name for name, value in (("optimizer.step_bound", opt.step_bound), ("optimizer.lr", opt.lr),
                                          ("optimizer.window", opt.window), ("optimizer.steps", opt.steps),
                                          ("optimizer.restart", opt.restart),
                                          ("sampling.start_batch", getattr(sampling, "start_batch", None)),
                                          ("sampling.period", getattr(sampling, "period", None)),
                                          ("estimator.start_directions", getattr(est, "start_directions", None)),
                                          ("estimator.directions", getattr(est, "directions", None)),
                                          ("estimator.period", getattr(est, "period", None)),
                                          ("mechanism.clip", getattr(mech, "clip", None)),
                                          ("mechanism.difference_clip", getattr(mech, "difference_clip", None)))
                 if value == "auto"]
        if opt.preset == "manual" and autos:
            problems.append(f"optimizer.preset: manual takes every setting as given; {autos[0]} is auto (give it, "
                            "or use preset: theory)")
        if opt.preset == "manual" and opt.target_stationarity is not None:
            problems.append("optimizer.target_stationarity: checked against the theorem by preset: theory only")
        paper_002 = est.kind in SPIDER_KINDS and getattr(est, "variant", None) != "001"
        allowed = (("c_T", "c_D", "c_h", "c_s") if multi_pass else ("c_D", "c_Sigma", "c_h", "c_s")) if paper_002 else ()
        stray = [c for c in opt.constants if c not in allowed]
        if stray:
            problems.append(f"optimizer.constants: {stray[0]} is not a constant of "
                            + (f"this algorithm's preset; allowed: {', '.join(allowed)}" if allowed else
                               "paper 001's presets, which hide none (theory_shape equals theory there)"))
        if opt.preset != "manual" and source.kind != "synthetic":
            a = spec.assumptions
            if a is None or a.lipschitz == "auto" or a.initial_gap == "auto":
                problems.append("assumptions: preset theory needs lipschitz and initial_gap (a synthetic source knows "
                                "its own); give them, or use preset: manual")
    if mech.kind == "gaussian" and mech.clip == "auto" and not (est.kind == "zo_naive" and opt.kind == "o2nc"
                                                                  and opt.preset != "manual"):
        problems.append("mechanism.clip: auto is derived by optimizer.preset theory (zo_naive); give a number")
    if spec.assumptions is not None and spec.assumptions.concentration_delta is not None and not (
            est.kind in SPIDER_KINDS and est.variant != "001"):
        problems.append("assumptions.concentration_delta: only paper 002's clip levels use it")
    return problems


def _tokens(source) -> Optional[tuple]:
    """What a source's rows are made of: None for numbers, (tokenizer, length) for token ids."""
    if source.kind == "text" or (source.kind == "file" and source.text is not None):
        return (source.tokenizer, source.max_length)
    return None


def _public_source_problems(source, public) -> List[str]:
    problems = []
    if _tokens(source) != _tokens(public):
        problems.append("data.split.public_source: its rows must be read like the main source's (both numbers, "
                        "or both text with the same tokenizer and max_length)")
    if public.kind == "file" and source.kind == "file" and [str(c) for c in public.classes] != [
            str(c) for c in source.classes]:
        problems.append("data.split.public_source.classes: must be data.source.classes, in the same order")
    if (source.kind == "images") != (public.kind == "images") or (source.kind == "images" and (
            public.image_shape != source.image_shape or public.classes != source.classes)):
        problems.append("data.split.public_source: images need public images of the same classes (in the same "
                        "order), mode and size")
    if getattr(public, "scale", "auto") != "auto":
        problems.append("data.split.public_source.scale: the main source's scale applies to both; remove it")
    return problems


def flatten(spec: RunSpec) -> Dict[str, str]:
    """Flattened ``section.key`` -> string view of the spec (MLflow params)."""
    out: Dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, sub in value.items():
                walk(f"{prefix}.{key}" if prefix else key, sub)
        else:
            out[prefix] = "null" if value is None else str(value)

    walk("", spec.model_dump(mode="json"))
    return out


