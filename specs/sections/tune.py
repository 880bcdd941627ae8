"""The ``tune`` section: hyperparameters chosen inside the guarantee (Papernot & Steinke, "Hyperparameter
tuning with Renyi differential privacy", ICLR 2022). A random number K of candidates, each a run of this spec
with one setting of the search space, and only the best is released; the whole is RDP at a small multiple of
one candidate's cost (dp-accounting's RepeatAndSelectDpEvent)."""
from __future__ import annotations

import math
from typing import Dict, List, Literal, Optional, Union

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from specs.base import Strict

# K's distribution: dp-accounting's shape parameter of each (the truncated negative binomial takes its own)
REPEAT_SHAPES = {"poisson": math.inf, "geometric": 1.0, "logarithmic": 0.0}
REPEAT_KINDS = (*REPEAT_SHAPES, "truncated_negative_binomial")

Value = Union[bool, int, float, str]


class RepeatSpec(Strict):
    """How many candidates run: K drawn at random (from the operating system's randomness, never released)."""

    distribution: Literal["poisson", "geometric", "logarithmic", "truncated_negative_binomial"] = Field(
        "truncated_negative_binomial", description="K's distribution (Papernot & Steinke): poisson, geometric, "
        "logarithmic, or truncated_negative_binomial with its shape.")
    mean: PositiveFloat = Field(..., description="E[K], at least 1: the candidates run on average.")
    shape: Optional[PositiveFloat] = Field(None, description="truncated_negative_binomial only: its shape "
                                           "eta > 0 (eta = 1 is the geometric).")

    @model_validator(mode="after")
    def _shape_and_mean(self):
        if self.mean < 1:
            raise ValueError(f"mean: E[K] is at least 1, not {self.mean}")
        if self.distribution == "truncated_negative_binomial" and self.shape is None:
            raise ValueError("shape: truncated_negative_binomial needs its shape eta > 0 (e.g. 0.5)")
        if self.distribution != "truncated_negative_binomial" and self.shape is not None:
            raise ValueError(f"shape: only truncated_negative_binomial takes a shape; {self.distribution} has its own")
        return self

    @property
    def accounting_shape(self) -> float:
        """dp-accounting's shape parameter of RepeatAndSelectDpEvent for this distribution."""
        return float(self.shape) if self.shape is not None else REPEAT_SHAPES[self.distribution]


class ScoreSpec(Strict):
    """What picks the winner: a metric of each trained candidate on rows that are not private."""

    split: Literal["public", "test"] = Field("public", description="The rows it is computed on: public (the "
                                             "winner's test score then stays unbiased) or test.")
    metric: Literal["accuracy", "loss"] = Field("accuracy", description="accuracy (higher wins) or loss (lower wins).")


class TuneSpec(Strict):
    """A search over this spec's settings whose selection is inside the guarantee: privacy.epsilon is the
    released winner's, the search included."""

    space: Dict[str, List[Value]] = Field(..., min_length=1, description="Spec fields by dotted path (e.g. "
                                          "optimizer.lr) and the values each candidate draws from; a candidate's "
                                          "setting is one value of each, drawn uniformly.")
    candidates: Optional[RepeatSpec] = Field(None, description="K's distribution: a search's (rows: private, or "
                                             "then: search), and the one a rehearsal's sigma is for (then: none); "
                                             "then: train trains one pick and needs none.")
    score: ScoreSpec = ScoreSpec()
    # not "on": YAML 1.1 (PyYAML) reads that key as the boolean true
    rows: Literal["private", "public"] = Field(
        "private", description="private: the search inside the guarantee, charged once. public: a rehearsal of "
        "every setting on the public rows only (three quarters train, a quarter score it when score.split is "
        "public), at the noise the private search would draw; it charges nothing and releases every setting's "
        "score.")
    folds: int = Field(4, ge=2, description="rows: public: the public rows are split in this many folds, and every "
                       "setting is trained once a fold on the others and scored on it (score.split public), so every "
                       "public row scores each setting once; its score is the mean over the folds.")
    then: Literal["none", "train", "search"] = Field(
        "none", description="rows: public: what follows the rehearsal in the same flow run. none: nothing (it "
        "prints what to run next). train: its pick, trained once on the private rows at the one-run sigma "
        "(privacy.epsilon is that run's). search: a private search among its best tune.top settings, K from "
        "tune.candidates (privacy.epsilon is the search's). The pick reads public rows only, so the private "
        "stage's guarantee is its own.")
    top: PositiveInt = Field(3, description="then: search: how many of the rehearsal's best settings it searches.")
    among: Optional[List[Dict[str, Value]]] = Field(
        None, min_length=1, description="The settings drawn from, when not the whole grid of the space: each "
                                        "gives a value of the space's lists for every field (then: search writes "
                                        "the rehearsal's best here).")
    pad_to: Optional[float] = Field(
        None, gt=0, lt=1, description="A private search's running time hidden too: every share of candidates (the "
        "search's, or each Ray task's) lasts as long as the K at this quantile of K's law would take (e.g. 0.99), "
        "timed by its own candidates, so the Prefect task's duration and the ledger charge's times do not tell K "
        "unless K is past that quantile. Costs that time every search.")

    @model_validator(mode="after")
    def _space(self):
        for path, values in self.space.items():
            if not values:
                raise ValueError(f"space.{path}: give at least one value")
            if path.split(".")[0] in ("tune", "privacy", "budget", "name", "seed", "tracking", "checkpoint", "data"):
                raise ValueError(f"space.{path}: {path.split('.')[0]} is not searched (the guarantee, the ledger "
                                 "and the rows are the search's own); search the model, estimator, mechanism, "
                                 "sampling or optimizer fields")
        if self.candidates is None and self.then != "train":
            raise ValueError("candidates: give K's distribution (e.g. {distribution: logarithmic, mean: 3}); only a "
                             "rehearsal whose pick is trained once (rows: public, then: train) needs none")
        if self.then != "none" and self.rows != "public":
            raise ValueError(f"then: {self.then} follows a rehearsal on the public rows; give tune.rows: public, or "
                             "then: none")
        if self.pad_to is not None and self.rows != "private" and self.then != "search":
            raise ValueError("pad_to: only a private search draws K (rows: private, or then: search); a rehearsal "
                             "trains every setting, and then: train one")
        for setting in self.among or ():
            if set(setting) != set(self.space):
                raise ValueError(f"among: the setting {setting} names other fields than the space "
                                 f"({', '.join(self.space)}); give a value for each of them")
            for path, value in setting.items():
                if value not in self.space[path]:
                    raise ValueError(f"among: {path} {value!r} is not one of the space's values for it "
                                     f"({self.space[path]})")
        return self

    def settings(self) -> List[Dict[str, Value]]:
        """Every setting drawn from (``among``, else the space's grid), in a fixed order."""
        if self.among is not None:
            return [dict(setting) for setting in self.among]
        grid: List[Dict[str, Value]] = [{}]
        for path, values in self.space.items():
            grid = [{**g, path: v} for g in grid for v in values]
        return grid
