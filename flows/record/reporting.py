"""Plain-language statements of what a run guarantees: the privacy report, the guarantee lines of a run and
its registered model, and a dataset's budget table. Every function here takes plain values and returns text:
the flow reads MLflow and the ledger, this module only words what they hold."""
from __future__ import annotations

import datetime as dt
import math
import shlex
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Iterable, List, Mapping, NamedTuple, Optional

from components.queries.clipped_sums import NON_FINITE_HANDLING
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
    person: Optional[str] = None  # person level: the column naming each row's person (data.blocks.person)
    selection: Optional[str] = None  # privzo tune: the search the guarantee includes (the winner's run only)

    def guarantee(self) -> str:
        return self.guarantee_at(self.epsilon, self.rho)

    def guarantee_at(self, epsilon: float, rho: Optional[float] = None) -> str:
        """The guarantee sentence at ``epsilon`` (a model's composed epsilon, or this run's); a tune's winner
        says the search it includes."""
        sentence = self._guarantee_at(epsilon, rho)
        if self.selection is None or not self.private:
            return sentence
        return f"{sentence} It includes the hyperparameter selection: {self.selection}."

    def _guarantee_at(self, epsilon: float, rho: Optional[float] = None) -> str:
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
            if self.person is not None:
                return (f"{pair} for add/remove of one person of {self.dataset} (every row with their "
                        f"{self.person!r}: each step samples persons and clips each sampled person's summed rows "
                        f"to C).{zcdp}")
            return f"{pair} for add/remove of one example of {self.dataset}.{zcdp}"
        rows = f" ({self.private_rows})" if self.private_rows is not None else ""
        return (f"{pair} for replacement of one example of {self.dataset}; the "
                f"number of private rows{rows} is the same for every such neighbour, and the run uses and "
                f"releases it.{zcdp}")

    def model_guarantee(self, model_epsilon: float, runs: int, start: str, blocks: int = 0,
                        person_level: bool = False) -> str:
        """The guarantee of a model that continued ``start`` (a registered version): every run since a seed
        initialisation composed; with ``blocks`` (data.blocks), per block, and the largest block's.
        ``model_epsilon`` inf: a start's privacy events are unknown."""
        if not self.private:
            return self.guarantee()
        if not math.isfinite(model_epsilon):
            return (f"unknown: {start}, which this model continued, was trained by runs whose privacy events are "
                    f"not recorded; this run alone is {self.guarantee()}")
        if blocks:
            why = ("every person's rows are in one block and a person moves each release by at most C, so it "
                   "bounds every person's loss" if person_level else
                   "every row is in one block, so it bounds every row's loss (event level: a person with several "
                   "rows may lose more)")
            return (self.guarantee_at(model_epsilon)[:-1] + f", the largest over the {blocks} blocks of data its {runs} "
                    f"runs read (this one and {start} back to a seed initialisation) of the composition of the runs "
                    f"that read each block: {why}.")
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
        large_delta_rows=spec.public_rows(sampler.rows) if privacy and spec.large_delta(sampler.rows) else None,
        person=spec.data.blocks.person if spec.person_level else None)


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


# ---------------------------------------------------------------- a run's and its model's guarantee lines
def trained_on(spec_name: str, estimator: str, mechanism: str, sampling: str, steps: int, source_kind: str,
               source_name: str, public_rows: int, test_rows: int, started: str, *, private_rows: Optional[int] = None,
               declared_private_rows: Optional[int] = None) -> str:
    """What a model was trained on and how, in a sentence. ``private_rows``: the count, only where it is
    public (replace-one); otherwise the sentence names ``declared_private_rows`` and says the count stays private."""
    rows = (f"{private_rows} private rows" if private_rows is not None else
            f"private rows declared as {declared_private_rows} (their count itself stays private)")
    return (f"Trained by privzo from spec {spec_name}: {estimator} with the {mechanism} "
            f"mechanism and {sampling.replace('_', ' ')} sampling, {steps} private steps on "
            f"{source_kind} data {source_name} ({rows}; {public_rows} public rows), evaluated on "
            f"{test_rows} test rows; started from {started}.")


def run_description(guarantee: str, trained_on: str, model_guarantee: Optional[str] = None) -> str:
    """An MLflow run's description: its guarantee, or, for a run that continued a registered version, the
    model's guarantee first and the run's own spend beside it."""
    head = (f"**Model guarantee:** {model_guarantee}\n\n**This run spent:** {guarantee}" if model_guarantee is not None
            else f"**Guarantee:** {guarantee}")
    return f"{head}\n\n{trained_on}"


def version_description(model_guarantee: str, run_id: str, guarantee: str, trained_on: str) -> str:
    """A registered version's description: it is the model, so the model's guarantee leads."""
    return f"**Model guarantee:** {model_guarantee}\n\n**Run {run_id} spent:** {guarantee}\n\n{trained_on}"


def byte_size(n: int) -> str:
    """1,234 B, 12.3 kB, 90.9 MB: decimal units, three significant digits."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:,} B"


def transcript_paragraph(model_name: str, version: str, entries: int, start: str, transcript_bytes: int,
                         weights_bytes: int, stream: str) -> str:
    """A transcript version's paragraph: what it holds instead of weights, and how to load it."""
    uri = f"models:/{model_name}/{version}"
    started = "the seeded initialisation" if start == "seed" else f"the weights of {start}"
    check = ("on a CUDA device (its directions were drawn on a GPU, whose rounding differs within a tolerance, so "
             "the trained weights' SHA-256 is not compared there)" if stream.startswith("cuda") else
             "and checks the result against the trained weights' SHA-256")
    return (f"**Transcript:** this version holds no weights: it is the run's resolved spec, its journal of {entries} "
            f"(seed, coefficient) entries and a reference to its public initial weights ({started}, after any public "
            f"warm start), {byte_size(transcript_bytes)} in place of {byte_size(weights_bytes)} of weights. Loading "
            f"replays the journal {check}: "
            f"`mlflow.pyfunc.load_model({uri!r})` for predictions, `flows.record.transcript.load_weights({uri!r})` for the "
            "torch module (both need privzo installed).")


def verify_hint(model_name: str, version: str, tracking_uri: Optional[str] = None, charged: bool = True) -> str:
    """The line a registered version's description carries on how to check it. ``tracking_uri``: named when
    given (the command's default is $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db). ``charged``: its run was
    charged to a privacy ledger; verify checks a version against that charge, so an uncharged one is told what
    it can and cannot be checked for, not given a command that fails."""
    command = f"privzo verify {shlex.quote(str(model_name))} {shlex.quote(str(version))}"
    if tracking_uri:
        command += f" --tracking-uri {shlex.quote(tracking_uri)}"
    if not charged:
        return ("Not charged to a privacy ledger (its spec has no budget section): `privzo verify` checks a version "
                "against the ledger's charge of the run that trained it, so it reports this one FAILED, and no owner "
                "can promote it to `@verified`; give the spec a budget section to train versions that can be "
                f"verified. Load this one as `models:/{model_name}/{version}`.")
    return (f"Verify: `{command}` checks this version's guarantee, tags and weights against the privacy ledger "
            "and the run that trained it. Load `models:/" + str(model_name) + "@verified`: the alias the ledger's "
            "owner sets with `privzo verify --promote` on a version that passes against the team's ledger (a run "
            "sets no alias).")


def registered_model_description(name: str, version: str, description: str) -> str:
    """The registered model's description, headed by its latest version's (``description``)."""
    return (f"Models trained under differential privacy by privzo from spec {name}; each version's description "
            f"and dp.* tags state its own guarantee.\n\n**Latest: version {version}.** {description}")


def initialisation_paragraph(started: str, model_epsilon: str, events_known: bool) -> str:
    """The privacy report's paragraph for a run that continued ``started`` (a registered version):
    ``model_epsilon`` as tagged (dp.model_epsilon), ``events_known`` False where a start's events are unknown."""
    return (f"\n**Initialisation.** {started}. The model trained on what that version was trained on "
            f"and on this run's data: its guarantee composes every run back to a seed initialisation, "
            f"epsilon {model_epsilon} at this run's delta (tag dp.model_epsilon"
            + ("" if events_known else "; unknown: a start's privacy events are not recorded")
            + "), against this run's own epsilon in dp.epsilon. A `budget` section keeps the dataset's "
            "total in the ledger.\n")


def result_summary(name: str, version: str, metrics: Mapping[str, float], model_guarantee: str, guarantee: str, *,
                   run_name: str, run_id: str, tracking_uri: str, browse_command: str, run_link: Optional[str],
                   version_link: Optional[str], experiment: str, experiment_link: Optional[str],
                   markdown: bool) -> List[str]:
    """The lines a Prefect user reads first: where the run and the model are in MLflow, and what they are
    (markdown links for the artifact; bare URLs for the log, which Prefect's UI does not render). A link
    that is None (a tracking store without a UI address) is written out in words. ``metrics``: the
    ``eval/`` ones are listed."""
    def link(text: str, url: Optional[str], otherwise: str) -> str:
        if url is None:
            return otherwise
        return f"[{text}]({url})" if markdown else f"{url} ({text})"

    shown_metrics = ", ".join(f"{k.split('/', 1)[1]} {v:.4f}" for k, v in metrics.items() if k.startswith("eval/"))
    bold = "**" if markdown else ""
    lines = [f"{name}: model version {version}, {shown_metrics}",
             "MLflow run: " + link(run_name, run_link, f"{run_id} in {tracking_uri} (browse it: {browse_command})"),
             "Registered model: " + link(f"{name} version {version}", version_link, f"{name} version {version}"),
             f"{bold}Model guarantee:{bold} {model_guarantee}"]
    if model_guarantee != guarantee:
        lines.append(f"{bold}This run spent:{bold} {guarantee}")
    if experiment_link:
        lines.append("All runs: " + link(f"experiment {experiment}", experiment_link, ""))
    return lines


def run_artifact(summary: List[str], budget: str, report: str) -> str:
    """The run's Prefect artifact: the summary (its first line the title), the budget table (if any) and the
    privacy report, one heading level down."""
    return "\n".join(["# " + summary[0], "", *(f"- {line}" for line in summary[1:]), "", budget,
                      report.replace("# Privacy report", "## Privacy report", 1)])


# ---------------------------------------------------------------- a dataset's budget
class BudgetRow(NamedTuple):
    """One charge of a dataset's ledger, as the budget table shows it."""
    run_id: Optional[str]
    epsilon: Optional[float]  # the charge's alone; None for an aborted one, which counts for nothing
    steps_run: int
    steps_planned: int
    status: str
    created_at: dt.datetime
    run_name: str


def budget_left_line(dataset: str, spent: float, lifetime_epsilon: float, fits: Optional[float]) -> str:
    """Where a run's commit left its dataset: what is spent (the largest block's composition) and the largest
    epsilon a next run shaped like it still fits; composition is not subtraction, so no "left"."""
    nxt = (f"a next run like this one fits up to epsilon {shown(fits)}" if fits is not None
           else "no run like this one fits any more")
    return f"dataset {dataset}: epsilon {shown(spent)} spent of the lifetime {lifetime_epsilon:g}; {nxt}"


def budget_table(dataset: str, ledger: str, delta: float, accountant: str, neighboring: str, lifetime_epsilon: float,
                 spent: float, charges: Iterable[BudgetRow], fits: Optional[float] = None) -> str:
    """A dataset's ledger as a markdown table: every run's epsilon, the exact total (``spent``, the composition
    of every run's event, never a sum; with blocks the largest block's) and the largest epsilon a next run
    shaped like the last still fits (``fits``). ``ledger``: its address without a password."""
    lines = [f"## Budget of dataset {dataset}", "",
             f"Ledger {ledger}: each run's epsilon alone, and the exact composition of all of them at delta "
             f"{shown(delta, 3)} ({accountant}, {neighboring}).", "",
             "| MLflow run | epsilon | steps | status | started (UTC) | spec |", "|---|---:|---:|---|---|---|"]
    for charge in charges:
        lines.append(f"| {charge.run_id or ''} | {'none' if charge.epsilon is None else shown(charge.epsilon)} | "
                     f"{charge.steps_run}/{charge.steps_planned} | {charge.status} | "
                     f"{charge.created_at:%Y-%m-%d %H:%M} | {charge.run_name} |")
    lines += [f"| **total (exact composition)** | **{shown(spent)} of {lifetime_epsilon:g}** | | | | |",
              f"| **a next run like the last fits up to** | **{'none' if fits is None else shown(fits)}** | | | | |", ""]
    return "\n".join(lines)
