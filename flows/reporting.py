"""Plain-language statements of what a run guarantees."""
from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Optional

from components.estimators.evaluate import NON_FINITE_HANDLING
from components.randomness import NOISE_SENTENCES


def _significant(x: float, digits: int, rounding: str) -> str:
    if not math.isfinite(x) or x == 0:
        return f"{x:g}"
    value = Decimal(repr(x))
    rounded = value.quantize(Decimal(1).scaleb(value.adjusted() - digits + 1), rounding=rounding)
    return f"{float(rounded):.{digits}g}"


def shown(x: float, digits: int = 4) -> str:
    """An epsilon, delta or rho as people read it: ``digits`` significant digits, rounded up, so a shown
    spend never understates the accounted one (1.9999999989 reads 2, 1.23441 reads 1.235)."""
    return _significant(x, digits, ROUND_CEILING)


def shown_left(x: float, digits: int = 4) -> str:
    """What is left of a budget, rounded down: a shown remainder never overstates it."""
    return _significant(max(x, 0.0), digits, ROUND_FLOOR)


@dataclass(frozen=True)
class PrivacySummary:
    dataset: str
    epsilon: float
    target_epsilon: float
    delta: float
    accountant: str
    neighboring: str
    noise_multiplier: float
    steps: int
    sampling_rate: float
    clip: float
    queries_per_step: int
    private: bool
    mechanism: str
    sampling: str  # the sampler's describe(), e.g. "Poisson, rate 0.0462 (expected batch 64 of 1384 declared rows)"
    step_event: str  # the sampler's event_phrase: what one step's DpEvent is, in words
    rho: Optional[float] = None  # zCDP rho, when the accountant is zcdp
    residual_clip: Optional[float] = None  # gep: the per-example clip of the residual (clip bounds the embedding)
    private_rows: Optional[int] = None  # the private row count, where the run used it (public under replace-one)
    noise_source: str = "fast"  # what drew the noise and batches: secure, fast or seeded (randomness.NOISE_SENTENCES)
    event_sentence: Optional[str] = None  # a single pass: how its releases compose, in place of the per-step one
    large_delta_rows: Optional[int] = None  # N, where delta is above 1/N (privacy.allow_large_delta)

    def guarantee(self) -> str:
        return self.guarantee_at(self.epsilon, self.rho)

    def guarantee_at(self, epsilon: float, rho: Optional[float] = None) -> str:
        """The guarantee sentence at ``epsilon`` (a model's composed epsilon, or this run's)."""
        if self.mechanism == "none":
            return (f"NOT private: mechanism none releases exact, unclipped values computed from {self.dataset} "
                    "(losses, or gradients for first_order); it has no (epsilon, delta) guarantee.")
        if not self.private:
            return (f"NOT private: insecure_deterministic drew the noise and batches from the public seed; "
                    f"the nominal ({shown(epsilon)}, {shown(self.delta, 3)}) does not hold for {self.dataset}.")
        zcdp = f" It is {shown(rho)}-zCDP, which implies that." if rho is not None else ""
        pair = f"({shown(epsilon)}, {shown(self.delta, 3)})-DP"
        if self.large_delta_rows is not None:  # leads, as "NOT private" does: the pair promises nothing of a row
            pair = (f"NOT a meaningful guarantee: delta {shown(self.delta, 3)} is above 1/N = 1/{self.large_delta_rows} "
                    f"(privacy.allow_large_delta), and publishing one random row whole meets it. {pair}")
        if self.neighboring == "add_remove":
            # every constant of the run (rate, steps, delta, normaliser) is public: plain add/remove DP
            return f"{pair} for add/remove of one example of {self.dataset}.{zcdp}"
        rows = f" ({self.private_rows})" if self.private_rows is not None else ""
        return (f"{pair} for replacement of one example of {self.dataset}; the "
                f"number of private rows{rows} is the same for every such neighbour, and the run uses and "
                f"releases it.{zcdp}")

    def model_guarantee(self, model_epsilon: float, runs: int, start: str) -> str:
        """The guarantee of a model that continued ``start`` (a registered version): every run since a seed
        initialisation composed. ``model_epsilon`` inf: a start's privacy events are unknown."""
        if not self.private:
            return self.guarantee()
        if not math.isfinite(model_epsilon):
            return (f"unknown: {start}, which this model continued, was trained by runs whose privacy events are "
                    f"not recorded; this run alone is {self.guarantee()}")
        return (self.guarantee_at(model_epsilon)[:-1] + f", composed over the {runs} runs that trained it "
                f"(this one and {start} back to a seed initialisation): it bounds every person's loss, whichever of "
                "those runs they were in.")


def privacy_report(s: PrivacySummary, metrics: dict, model: Optional[str] = None) -> str:
    """``model``: the model's own guarantee, where the run continued a registered version; it leads, and
    the run's spend follows it, named as such."""
    headline = ([f"**Model guarantee.** {model}", "", f"**This run's spend.** {s.guarantee()}"] if model else
                [f"**Guarantee.** {s.guarantee()}"])
    lines = [
        f"# Privacy report: {s.dataset}",
        "",
        *headline,
        "",
        "| quantity | value |",
        "|---|---|",
        f"| epsilon spent by this run (accounted) | {shown(s.epsilon, 6)} |" if s.private or s.mechanism == "none" else
        f"| nominal epsilon (NOT private: insecure_deterministic) | {shown(s.epsilon, 6)} |",
        f"| epsilon target | {s.target_epsilon:.6g} |",
        f"| delta | {shown(s.delta, 6)} |" if s.large_delta_rows is None else
        f"| delta | {shown(s.delta, 6)} (above 1/N = 1/{s.large_delta_rows}: not a meaningful guarantee) |",
        f"| accountant | {s.accountant} (dp-accounting) |",
        *([f"| zCDP rho spent | {shown(s.rho, 6)} |"] if s.rho is not None else []),
        f"| neighbouring relation | {s.neighboring} |",
        f"| noise multiplier sigma | {s.noise_multiplier:.6g} |",
        f"| private steps | {s.steps} |",
        f"| sampling | {s.sampling} |",
        f"| sampling rate | {s.sampling_rate:.6g} |",
        f"| clip C | {s.clip:.6g} |" if s.residual_clip is None else f"| clip C (gep: of the embedding) | {s.clip:.6g} |",
        *([f"| residual clip C2 (gep) | {s.residual_clip:.6g} |"] if s.residual_clip is not None else []),
        f"| noisy queries per step | {s.queries_per_step} |",
        "",
        s.event_sentence or ("Each step releases the clipped per-example sums of its queries with Gaussian noise; "
                             f"the run's DpEvent (dp_event.json) is the self-composition of {s.step_event}."),
        (NOISE_SENTENCES.get(s.noise_source, NOISE_SENTENCES["fast"]) +
         ("" if s.sampling_rate < 1 or s.event_sentence else " Every private row is in every step."))
        if s.private else "**This run is not private.**",
        "",
        NON_FINITE_HANDLING,
        "",
        "## Metrics (evaluation split, not private training data)",
        "",
    ]
    lines += [f"- {k}: {v:.4f}" for k, v in metrics.items()]
    return "\n".join(lines) + "\n"


def summarize(spec, tracker_epsilon: float, steps: int, sampler, queries_per_step: int,
              rho: Optional[float] = None, noise_source: str = "fast") -> PrivacySummary:
    """The privacy summary of a resolved run spec after ``steps`` executed steps of ``sampler``'s batches
    (``rho``: their zCDP rho under the zcdp accountant)."""
    privacy = spec.privacy
    return PrivacySummary(
        dataset=spec.data.source.name, epsilon=tracker_epsilon,
        target_epsilon=privacy.epsilon if privacy else math.inf, delta=float(privacy.delta) if privacy else 0.0,
        accountant=privacy.accountant if privacy else "none", neighboring=privacy.neighboring if privacy else "none",
        noise_multiplier=float(spec.mechanism.noise_multiplier) if privacy else 0.0, steps=steps,
        sampling_rate=sampler.rate, sampling=sampler.describe(), step_event=sampler.event_phrase, clip=getattr(spec.mechanism, "clip", math.inf),
        queries_per_step=queries_per_step, private=spec.private, mechanism=spec.mechanism.kind,
        rho=rho if privacy else None,
        residual_clip=getattr(spec.estimator, "residual_clip", None) if privacy else None,
        private_rows=sampler.rows if spec.private_count_is_public else None, noise_source=noise_source,
        event_sentence=_single_pass_sentence(spec),
        large_delta_rows=spec.public_rows(sampler.rows) if privacy and spec.large_delta(sampler.rows) else None)


def _single_pass_sentence(spec) -> Optional[str]:
    if spec.mechanism.kind == "scheduled_gaussian":
        full = spec.sampling.kind == "full_batch"
        return ("{rows} A restart every {period} steps releases the mean of {its} rows' clipped estimates with Gaussian "
                "noise (multiplier {z1:.6g}); every other step adds the mean of their clipped differences with its own "
                "Gaussian noise (multiplier {z2:.6g}) to the previous release, so the run's DpEvent (dp_event.json) is "
                "the composition of its restarts' and differences' {kind} releases."
                ).format(rows="Every row is in every step." if full else
                         "Every step reads a fresh Poisson batch and normalises by its expected size.",
                         its="all" if full else "the batch's", kind="Gaussian" if full else "Poisson-subsampled Gaussian",
                         period=spec.estimator.period, z1=float(spec.mechanism.noise_multiplier),
                         z2=float(spec.mechanism.difference_noise_multiplier))
    if spec.sampling.kind != "single_pass":
        return None
    if spec.mechanism.kind == "tree_aggregation":
        return ("Each step adds the batch mean of fresh rows' clipped estimates to its period's running sum, and "
                "releases that sum with tree noise (one fresh Gaussian node per step, Fenwick form, a fresh tree "
                f"each period of {spec.sampling.period} steps); each row is read in one step of the single pass, so "
                "the run's DpEvent (dp_event.json) is floor(log2 period) + 1 Gaussian releases of multiplier sigma "
                "(node std over the node sensitivity).")
    return ("Each step releases the d-dimensional mean of fresh rows' clipped estimates with Gaussian noise; each "
            "row is read in one step of the single pass, so the run's DpEvent (dp_event.json) is one Gaussian of "
            "multiplier sigma.")
