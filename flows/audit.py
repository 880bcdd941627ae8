"""``privacy_audit``: an empirical lower bound on a spec's epsilon, beside the epsilon it claims.

The audit trains the spec's model with its estimator, mechanism, sampler and accountant on canaries
(components/audit) and turns membership guesses into a one-run lower bound on epsilon for two threat
models: white-box (every value the run releases) and black-box (the final model's losses). It reads no
private row of the spec's data (only its public rows, which PAZO's estimators and the optional
background use), so it spends no budget and touches no ledger. Logged as one MLflow run: the spec as
params (with --epsilon applied), ``audit.*`` tags, ``audit_report.md``, ``audit.json`` and the canaries' scores.
"""
from __future__ import annotations

import io
import json
from typing import Any, Dict, Optional

import mlflow
import torch
from mlflow.entities import Param, RunTag
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

import specs
from components import builders
from components.audit import (
    AuditResult,
    audit,
    audit_many,
    audit_problem,
    default_runs,
    runs_problem,
    with_epsilon,
)
from flows.record.tracking import log_text_artifacts
from flows.record.tracking_names import (
    AUDIT_ARTIFACT, AUDIT_BACKGROUND, AUDIT_BLACK_BOX_CORRECT, AUDIT_BLACK_BOX_EPSILON_LOWER,
    AUDIT_BLACK_BOX_GUESSES, AUDIT_CANARIES, AUDIT_CANARIES_ARTIFACT, AUDIT_CLAIMED_EPSILON, AUDIT_CONFIDENCE,
    AUDIT_DELTA, AUDIT_EPSILON_LOWER, AUDIT_ESTIMATOR, AUDIT_EXCEEDS_CLAIM, AUDIT_METHOD, AUDIT_NOISE_MULTIPLIER,
    AUDIT_NOISE_SCALE, AUDIT_PERSON_ROWS, AUDIT_REPORT_ARTIFACT, AUDIT_RUNS, AUDIT_SECONDS, AUDIT_SHARE_AT_CLIP,
    AUDIT_STEPS, AUDIT_THREAT_MODELS, AUDIT_WHITE_BOX_CORRECT, AUDIT_WHITE_BOX_EPSILON_LOWER,
    AUDIT_WHITE_BOX_GUESSES, PRIVZO_ESTIMATOR, PRIVZO_KIND, PRIVZO_SPEC, SPEC_ARTIFACT)


@task(name="audit-run", cache_policy=NO_CACHE, retries=0)
def run_audit(spec: specs.RunSpec, canaries: Optional[int], confidence: float, background: str,
              noise_scale: float, guesses: Optional[int], threads: Optional[int], runs: int = 1,
              person_rows: Optional[int] = None) -> AuditResult:
    """Train on the canaries and bound epsilon (one run, or ``runs`` runs of one canary each); noise is
    drawn here, so never retried. ``threads``: torch's intra-op threads for the audit (default:
    execution.threads, else 1: the audit's forwards are small, and on the project's busy 2-core machine one
    thread ran them 3-10x faster than two)."""
    # an audit reads no private row: of a spec on blocks, every block's rows give the shapes and public rows
    data = builders.load_data(spec, every_block=spec.data.blocks is not None)
    before = torch.get_num_threads()
    torch.set_num_threads(threads or spec.execution.threads or 1)
    logger = get_run_logger()

    def progress(done: int, total: int) -> None:
        if done % max(1, total // 10) == 0 or done == total:
            logger.info("audit %s: %d of %d training runs done", spec.name, done, total)

    try:
        if runs == 1:
            return audit(spec, data, canaries=canaries, confidence=confidence, background=background,
                         noise_scale=noise_scale, guess_count=guesses, person_rows=person_rows)
        return audit_many(spec, data, runs=runs, confidence=confidence, background=background,
                          noise_scale=noise_scale, on_run=progress, person_rows=person_rows)
    finally:
        torch.set_num_threads(before)


def report(result: AuditResult) -> str:
    """The audit as markdown: what was claimed, what the audit showed, and what the numbers mean."""
    ceiling = result.ceiling
    verdict = ("**The audit refutes the claim**: a lower bound exceeds the claimed epsilon"
               if result.exceeds_claim else "The lower bounds are below the claimed epsilon, as they must be for a "
               "correct mechanism.")
    lines = [
        f"# Privacy audit: {result.spec_name} ({result.estimator})",
        "",
        verdict,
        "",
        f"| threat model | epsilon lower bound | claimed epsilon | guesses | correct | "
        f"{'runs' if result.method == 'many-runs' else 'canaries'} bounded | separation |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in (result.white_box, result.black_box):
        lines.append(f"| {t.threat.replace('_', '-')} | {t.epsilon_lower:.3f} | {result.claimed_epsilon:.4g} | "
                     f"{t.guesses} | {t.correct} | {t.canaries_bounded} | {t.separation:.2f} |")
    lines += [
        "",
        f"- Claim audited: ({result.claimed_epsilon:.4g}, {result.delta:.3g})-DP under {result.neighboring} neighbours "
        f"(target epsilon {result.target_epsilon:g}, {result.accountant} accountant), noise multiplier "
        f"{result.noise_multiplier:.4g}, {result.steps} steps, {result.sampling}.",
        f"- Each lower bound holds with probability at least {result.confidence:g}: if the mechanism were "
        f"({result.claimed_epsilon:.4g}, {result.delta:.3g})-DP, a bound above {result.claimed_epsilon:.4g} would "
        f"occur with probability at most {1 - result.confidence:.3g}. Method: {result.method_sentence}.",
        f"- With every guess right, this design ({_design(result)}) at this delta and confidence could show at "
        f"most epsilon {ceiling:.3g}: it cannot refute claims above that.",
        *([f"- Person level: each canary is a person of {result.person_rows} rows (copies of one canary row, "
           "pushing every release the same way), sampled and clipped as the run samples and clips persons; the "
           "claim is for adding or removing one person."] if result.person_rows > 1 else []),
        f"- Canaries: random feature directions with random labels, scaled x{result.canary_scale:.3g} so that "
        f"{100 * result.share_at_clip:.1f}% of their per-example values reached the clip "
        f"(finite differences at +-C, gradients of norm C, losses at C). Background rows: "
        f"{result.background_rows} ({_background(result)}). No private row of the spec was read.",
        "- White-box: every release scored against each canary's clipped contribution at the public parameters "
        "of its step, the canaries' known overlap undone; black-box: each canary's loss drop from the public "
        "initial model to the final one. Separation: (mean score of included - mean of excluded) / pooled sd.",
        *(["- Many runs: white-box guesses \"in\" when the score is above the midpoint of its expectations in "
           "and out (0, fixed before any run); black-box picks its threshold on a public half of the runs and "
           "is bounded on the other half."] if result.method == "many-runs" else []),
        f"- Time: {result.seconds:.1f} s on {result.threads} torch thread(s), in-process.",
    ]
    if result.noise_scale != 1.0:
        lines.append(f"- **Deliberately broken run**: the noise was multiplied by {result.noise_scale:g} while the "
                     f"claim stayed the one calibrated for sigma {result.noise_multiplier:.4g}.")
    lines += [f"- {note}" for note in result.notes]
    return "\n".join(lines) + "\n"


def _background(result: AuditResult) -> str:
    if not result.filled_rows:
        return result.background
    # the theory families plan from the spec's N rows: the audit's run has them, canaries and filled rows
    public = result.background_rows - result.filled_rows
    return (f"{result.filled_rows} filled by the audit to the spec's private row count, which its plan is for"
            + (f", and {public} public" if public else ""))


def _design(result: AuditResult) -> str:
    if result.method == "many-runs":
        return f"{result.runs} runs"
    return f"{result.canaries} canaries in one run"


def _canaries_csv(result: AuditResult) -> str:
    out = io.StringIO()
    out.write(f"{'run' if result.method == 'many-runs' else 'slot'},included,white_box_score,black_box_score\n")
    for i, (inc, w, b) in enumerate(zip(result.included, result.white_box_scores, result.black_box_scores)):
        out.write(f"{i},{int(inc)},{w:.9g},{b:.9g}\n")
    return out.getvalue()


def summary(result: AuditResult) -> Dict[str, Any]:
    return {
        "spec": result.spec_name, "estimator": result.estimator, "claimed_epsilon": result.claimed_epsilon,
        "delta": result.delta, "confidence": result.confidence, "canaries": result.canaries,
        "noise_multiplier": result.noise_multiplier, "noise_scale": result.noise_scale, "steps": result.steps,
        "method": result.method, "runs": result.runs, "filled_rows": result.filled_rows,
        "person_rows": result.person_rows,
        "epsilon_lower": result.epsilon_lower, "exceeds_claim": result.exceeds_claim,
        "white_box": {"epsilon_lower": result.white_box.epsilon_lower, "guesses": result.white_box.guesses,
                      "correct": result.white_box.correct, "canaries_bounded": result.white_box.canaries_bounded,
                      "separation": result.white_box.separation},
        "black_box": {"epsilon_lower": result.black_box.epsilon_lower, "guesses": result.black_box.guesses,
                      "correct": result.black_box.correct, "canaries_bounded": result.black_box.canaries_bounded,
                      "separation": result.black_box.separation},
        "share_at_clip": result.share_at_clip, "seconds": result.seconds, "threads": result.threads,
        "ceiling": result.ceiling,
    }


def audit_tags(result: AuditResult) -> Dict[str, str]:
    """``audit.*`` tags: strings, as MLflow stores them."""
    return {
        AUDIT_CLAIMED_EPSILON: f"{result.claimed_epsilon:.6g}",
        AUDIT_DELTA: f"{result.delta:.6g}",
        AUDIT_EPSILON_LOWER: f"{result.epsilon_lower:.6g}",
        AUDIT_WHITE_BOX_EPSILON_LOWER: f"{result.white_box.epsilon_lower:.6g}",
        AUDIT_WHITE_BOX_GUESSES: str(result.white_box.guesses),
        AUDIT_WHITE_BOX_CORRECT: str(result.white_box.correct),
        AUDIT_BLACK_BOX_EPSILON_LOWER: f"{result.black_box.epsilon_lower:.6g}",
        AUDIT_BLACK_BOX_GUESSES: str(result.black_box.guesses),
        AUDIT_BLACK_BOX_CORRECT: str(result.black_box.correct),
        AUDIT_CONFIDENCE: f"{result.confidence:g}",
        AUDIT_CANARIES: str(result.canaries),
        AUDIT_THREAT_MODELS: "white_box,black_box",
        AUDIT_METHOD: ("many-runs (Clopper-Pearson)" if result.method == "many-runs"
                       else "one-run (Steinke, Nasr and Jagielski 2023, Cor. 5.4)"),
        AUDIT_RUNS: str(result.runs),
        AUDIT_PERSON_ROWS: str(result.person_rows),
        AUDIT_EXCEEDS_CLAIM: str(result.exceeds_claim).lower(),
        AUDIT_NOISE_SCALE: f"{result.noise_scale:g}",
        AUDIT_ESTIMATOR: result.estimator,
        AUDIT_NOISE_MULTIPLIER: f"{result.noise_multiplier:.6g}",
        AUDIT_STEPS: str(result.steps),
        AUDIT_BACKGROUND: result.background,
        AUDIT_SHARE_AT_CLIP: f"{result.share_at_clip:.4g}",
        AUDIT_SECONDS: f"{result.seconds:.1f}",
    }


@task(name="log-audit", cache_policy=NO_CACHE, retries=2)
def log_audit(spec: specs.RunSpec, result: AuditResult, tracking_uri: str, experiment: str) -> str:
    """One MLflow run: the audited spec as params, ``audit.*`` tags, the report and the canaries' scores."""
    # a client of its own: mlflow.set_tracking_uri would also set MLFLOW_TRACKING_URI for the whole process
    client = mlflow.MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    experiment_id = exp.experiment_id if exp is not None else client.create_experiment(experiment)
    run = client.create_run(experiment_id, run_name=f"{spec.name}-audit", tags={
        PRIVZO_SPEC: spec.name, PRIVZO_ESTIMATOR: spec.estimator.kind, PRIVZO_KIND: "audit"})
    params = {k: v for k, v in specs.flatten(spec).items()}
    client.log_batch(run.info.run_id, params=[Param(k, v[:6000]) for k, v in params.items()],
                     tags=[RunTag(k, v) for k, v in audit_tags(result).items()])
    log_text_artifacts(client, run.info.run_id, {
        AUDIT_REPORT_ARTIFACT: report(result),
        AUDIT_ARTIFACT: json.dumps(summary(result), indent=2),
        AUDIT_CANARIES_ARTIFACT: _canaries_csv(result),
        SPEC_ARTIFACT: specs.dump_yaml(spec),
    })
    client.set_terminated(run.info.run_id)
    return run.info.run_id


@flow(name="privacy-audit", log_prints=True, validate_parameters=False)
def privacy_audit(spec_path: Optional[str] = None, spec: Optional[Dict[str, Any]] = None,
                  canaries: Optional[int] = None, confidence: float = 0.95, background: str = "none",
                  noise_scale: float = 1.0, guesses: Optional[int] = None, tracking_uri: Optional[str] = None,
                  experiment: Optional[str] = None, log: bool = True, threads: Optional[int] = None,
                  epsilon: Optional[float] = None, runs: Optional[int] = None,
                  person_rows: Optional[int] = None) -> Dict[str, Any]:
    """Audit one spec (a YAML path or a mapping), at ``epsilon`` instead of its privacy.epsilon if given;
    ``runs``: 1 for the one-run audit, at least 10 for many runs of one canary each (default: 1, and
    components.audit.default_runs where one run cannot tell canaries apart). Returns the summary, with
    ``run_id`` when logged."""
    if (spec_path is None) == (spec is None):
        raise ValueError("privacy_audit: give exactly one of spec_path or spec")
    run_spec = specs.load_spec(spec_path) if spec_path is not None else specs.spec_from_dict(spec)
    if epsilon is not None:
        run_spec = with_epsilon(run_spec, epsilon)
    problem = audit_problem(run_spec)
    if problem:
        raise ValueError(problem)
    runs = default_runs(run_spec) if runs is None else runs
    problem = runs_problem(runs, canaries, guesses)
    if problem:
        raise ValueError(problem)
    result = run_audit(run_spec, canaries, confidence, background, noise_scale, guesses, threads, runs, person_rows)
    out = summary(result)
    out["report"] = report(result)
    get_run_logger().info("audit %s: claimed epsilon %.4g, lower bounds white-box %.3f, black-box %.3f (%s, "
                          "confidence %g)", run_spec.name, result.claimed_epsilon, result.white_box.epsilon_lower,
                          result.black_box.epsilon_lower, _design(result), result.confidence)
    if log:
        uri = tracking_uri or run_spec.tracking.uri
        out["tracking_uri"] = uri
        out["run_id"] = log_audit(run_spec, result, uri, experiment or run_spec.tracking.experiment or run_spec.name)
    return out
