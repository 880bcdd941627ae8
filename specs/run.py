"""The whole run: one typed spec, validated per field and then by cross-field rules."""
from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any, Dict, Optional

from pydantic import Field, model_validator

from specs.base import Strict
from specs.rules import cross_field_problems
from specs.traits import MULTI_PASS_SAMPLERS, RUNNING_SUM_ESTIMATORS
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
    TuneSpec,
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
    tune: Optional[TuneSpec] = Field(None, description="Hyperparameters chosen inside the guarantee (privzo tune): "
                                     "a random number of candidates, only the best released.")

    @model_validator(mode="before")
    @classmethod
    def _window_declares_n(cls, data: Any) -> Any:
        """With data.blocks, N is the blocks' declared size times the window's length: public facts only."""
        if not isinstance(data, dict):
            return data
        d, b = data.get("data"), data.get("budget")
        blocks = d.get("blocks") if isinstance(d, dict) else None
        window = b.get("window") if isinstance(b, dict) else None
        if isinstance(blocks, dict) and isinstance(window, dict) and d.get("declared_private_rows") is None:
            # N counts neighbouring units: persons in a person-level run, rows otherwise
            per = blocks.get("declared_persons" if blocks.get("person") else "declared_private_rows")
            length = window.get("blocks")
            if isinstance(per, int) and isinstance(length, int) and per > 0 and length > 0:
                return {**data, "data": {**d, "declared_private_rows": per * length}}
        return data

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
    def person_level(self) -> bool:
        """Whether the guarantee is per person (data.blocks.person): a step samples persons and clips each
        sampled person's summed rows, and N, the rate's and delta's denominator, counts persons."""
        return self.data.blocks is not None and self.data.blocks.person is not None

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
        if self.estimator.kind in RUNNING_SUM_ESTIMATORS:
            values += [self.estimator.start_directions, self.estimator.directions]
            if self.sampling.kind in MULTI_PASS_SAMPLERS:
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


_URL_PASSWORD = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]+):[^@/\s]*@")


def without_passwords(value: Any) -> Any:
    """``value`` (a dumped spec) with the password of every URL in it shown as ***: a team's ledger or
    store URL holds its role's password, and a spec is logged where every reader of MLflow sees it."""
    if isinstance(value, dict):
        return {k: without_passwords(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_passwords(v) for v in value]
    return _URL_PASSWORD.sub(r"\1:***@", value) if isinstance(value, str) else value


def released_dump(spec: RunSpec) -> Dict[str, Any]:
    """The spec as it is logged and released (params, spec.yaml): every field, no URL's password."""
    return without_passwords(spec.model_dump(mode="json"))


def flatten(spec: RunSpec) -> Dict[str, str]:
    """Flattened ``section.key`` -> string view of the spec (MLflow params), no URL's password."""
    out: Dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, sub in value.items():
                walk(f"{prefix}.{key}" if prefix else key, sub)
        else:
            out[prefix] = "null" if value is None else str(value)

    walk("", released_dump(spec))
    return out


def spec_digest(spec) -> str:
    """What must not change between a run and its resumption: the resolved spec except checkpoint and
    tracking cadence (both only say where and how often to write), how the model is registered, direction
    prefetching (the same values, drawn earlier) and the passwords in its URLs (a role's password may be
    rotated between a crash and its resumption)."""
    body = without_passwords(spec.model_dump(mode="json", exclude={
        "checkpoint": True, "tracking": {"log_every", "register_as"}, "execution": {"prefetch_directions"}}))
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
