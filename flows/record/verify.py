"""``privzo verify``: a registered model version checked against the privacy ledger and the run that trained it.

A version's dp.* tags and description are text anyone with write access to the registry can change, and its
weights are an artifact anyone can log again under the same run. ``verify`` recomputes what they should say
from what privzo recorded elsewhere and names the first disagreement in one line. The six checks, in order
(``flows.record.verify_report.CHECKS``; docs/guide/stack.md, "Checking a registered model", says each in full): the
**source run** logged a privzo spec with a ``budget``; the **ledger charge** of that run is committed and is
its reservation's plan cut to the steps it ran (``components.accountants.beyond_plan``); its **epsilon**
(the executed DpEvent is the run's ``dp_event.json`` and composes to its tags, at the precision they are
written with, ``flows.record.reporting.shown``); the **model guarantee** recomposed from the ledger over the
model's lineage (``flows.record.lineage``, per block with data.blocks); the run's params are its **spec**, reserved
for the rows of its keyed **fingerprint**; and, where the journal of ``(seed, coefficient)`` steps is the
whole trajectory (two_point with sgd), the **weights** are its replay (``components.optimizers.replay``)
from the public initial weights, bit for bit on CPU (within ``flows.record.transcript.GPU_RTOL`` / ``GPU_ATOL``
for a GPU stream); a transcript version is that replay, loaded as ``mlflow.pyfunc.load_model`` loads it.

The ledger is the one given, else the team's ``$PRIVZO_LEDGER_URL``, else the spec's; verify asks it for the
run's charges (``PrivacyLedger.run_charges``) and reads none of its tables. Nothing is charged, tagged or
registered: the ledger and the MLflow store are only read (a SQLite ledger that does not exist is reported,
never created). ``verify_command`` is what ``privzo verify`` runs; its ``--promote`` is flows/record/promotion.py's.
"""
from __future__ import annotations

import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import dp_accounting
import mlflow
import yaml
from mlflow.exceptions import MlflowException

import specs
from specs.sections.tracking import tracking_uri_from_env
from components.accountants import Accountant, beyond_plan, event_from_json
from flows.record import promotion
from flows.ledger import ABORTED, COMMITTED, Charge, PrivacyLedger, recomposition_problems, shown_url
from flows.record.verify_report import CHECKS, FAILED, NOT_APPLICABLE, NOT_RUN, OK, Check, VerifyReport
from flows.record.tracking_names import (
    DATA_FINGERPRINT, DERIVED_N_PRIVATE, DP_ACCOUNTANT, DP_DELTA, DP_EPSILON, DP_EVENT_ARTIFACT, DP_GUARANTEE,
    DP_MODEL_EPSILON, DP_MODEL_RUNS, DP_NEIGHBORING, DP_RUN_EPSILON, DP_RUN_GUARANTEE, DP_STEPS, JOURNAL_ARTIFACT,
    MODEL_BLOCK_EVENTS_ARTIFACT, MODEL_EVENT_ARTIFACT, PRIVZO_BLOCKS, PRIVZO_DIRECTIONS_STREAM, PRIVZO_DIRECTIONS_VERSION,
    PRIVZO_INIT, PRIVZO_INIT_RUN_ID, SPEC_ARTIFACT)

def verify_command(model_name: str, version: Optional[str] = None, tracking_uri: Optional[str] = None,
                   ledger_url: Optional[str] = None, out=None, promote: bool = False) -> int:
    """``privzo verify``: print the report (its headline names the first mismatch); 0 when every check passes,
    1 when one fails. A model or version that does not exist raises ValueError (the CLI's one-line error).

    ``promote`` (the ledger owner's, against the team's ledger: ``ledger_url`` or $PRIVZO_LEDGER_URL): a
    version that passes gets the registered model's alias ``verified`` (which then leaves the version it was
    on), one that fails loses it. Consumers load ``models:/NAME@verified``; a run registers no alias, so a
    version charged to another ledger or with steps its charge does not count never gets it."""
    import sys

    from specs.sections import LEDGER_URL_ENV

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one line a check, no bars between
    if promote:
        ledger_url = ledger_url or os.environ.get(LEDGER_URL_ENV, "").strip() or None
        if ledger_url is None:
            raise ValueError(f"--promote: the {promotion.VERIFIED!r} alias says a version passed against the team's ledger; "
                             f"give that ledger with --ledger or ${LEDGER_URL_ENV}")
    report = verify(model_name, version, tracking_uri, ledger_url)
    print(str(report), file=out or sys.stdout)
    if promote:
        print(promotion.promote(report, tracking_uri, PrivacyLedger.open(ledger_url)), file=out or sys.stdout)
    return 0 if report.passed else 1


class _Mismatch(Exception):
    """A check failed: its one line."""


def verify(model_name: str, version: Optional[str] = None, tracking_uri: Optional[str] = None,
           ledger_url: Optional[str] = None) -> VerifyReport:
    """Check registered model ``model_name`` version ``version`` (default: its latest) in ``tracking_uri``
    (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db) against the privacy ledger (``ledger_url``,
    default: the ledger its run's spec names) and its run. Raises ValueError when the model or version does
    not exist; every other problem is a failed check in the report."""
    uri = tracking_uri or tracking_uri_from_env()
    client = mlflow.MlflowClient(uri)
    found = _model_version(client, model_name, version)
    with tempfile.TemporaryDirectory(prefix="privzo-verify-") as folder:
        checker = _Verifier(client, uri, found, ledger_url, Path(folder))
        return checker.checked()


def _model_version(client: mlflow.MlflowClient, name: str, version: Optional[str]):
    try:
        if version is None:
            versions = client.search_model_versions(f"name = '{name}'")
            if not versions:
                raise ValueError(f"verify: no registered model {name!r} in {client.tracking_uri}")
            return max(versions, key=lambda v: int(v.version))
        return client.get_model_version(name, str(version))
    except MlflowException as err:
        raise ValueError(f"verify: no version {version} of registered model {name!r} in {client.tracking_uri} "
                         f"({str(err.message).splitlines()[0]})") from None


def _pair(sentence: str) -> Optional[Tuple[str, str]]:
    """The (epsilon, delta) a guarantee sentence states first, as written."""
    found = re.search(r"\(([^,() ]+), ([^,() ]+)\)", sentence or "")
    return (found.group(1), found.group(2)) if found else None


def _holds(mapping: Any, dotted: str) -> bool:
    """Whether a logged spec mapping has the flattened key ``dotted`` (``tracking.register_as``)."""
    for part in dotted.split("."):
        if not isinstance(mapping, dict) or part not in mapping:
            return False
        mapping = mapping[part]
    return True


def _paragraph_after(text: str, head: str) -> Optional[str]:
    at = (text or "").find(head)
    if at < 0:
        return None
    return text[at + len(head):].split("\n\n", 1)[0].strip()


class _Verifier:
    def __init__(self, client: mlflow.MlflowClient, uri: str, version, ledger_url: Optional[str], folder: Path):
        self.client, self.uri, self.version, self.override, self.folder = client, uri, version, ledger_url, folder
        self.name, self.number = version.name, str(version.version)
        self.where = f"version {self.number}"
        self._runs: Dict[str, Any] = {}
        self._specs: Dict[str, specs.RunSpec] = {}
        self._charges: Dict[str, Charge] = {}
        self._ledgers: Dict[str, Any] = {}
        self.run = self.spec = self.charge = None
        self.run_epsilon: Optional[float] = None
        self.model_eps: Optional[float] = None

    # ------------------------------------------------------------ the checks, in order
    def checked(self) -> VerifyReport:
        report = VerifyReport(self.name, self.number, self.version.run_id or None, self.uri, self.override)
        steps = [self._source_run, self._ledger_charge, self._epsilon, self._model_guarantee,
                 self._spec_and_fingerprint, self._weights]
        needs = {"ledger charge": 1, "epsilon": 2, "model guarantee": 3, "spec and fingerprint": 2, "weights": 1}
        done: Dict[str, str] = {}
        for name, step in zip(CHECKS, steps):
            blocking = [CHECKS[i] for i in range(needs.get(name, 0)) if done.get(CHECKS[i]) != OK]
            if blocking:
                status, detail = NOT_RUN, f"needs the {blocking[0]} check to pass"
            else:
                try:
                    status, detail = step()
                except _Mismatch as err:
                    status, detail = FAILED, str(err)
                except Exception as err:  # noqa: BLE001 - a store or ledger that cannot be read: not verified
                    line = str(err).splitlines()[0] if str(err) else ""
                    status, detail = FAILED, f"could not check: {type(err).__name__}: {line}"
            done[name] = status
            report.checks.append(Check(name, status, detail))
            if name == "ledger charge" and self.charge is not None:
                report.ledger_url = self.charge.ledger
        return report

    def _source_run(self) -> Tuple[str, str]:
        run_id = self.version.run_id
        if not run_id:
            raise _Mismatch(f"{self.where} was registered by hand: it has no source run, so nothing records how it "
                            "was trained or what it spent")
        run = self._get_run(run_id)
        if run is None:
            raise _Mismatch(f"{self.where}'s source run {run_id} does not exist in {self.uri}")
        spec = self._spec_of(run_id)
        if spec is None:
            raise _Mismatch(f"{self.where} was registered by hand: its run {run_id} is not a privzo run (it logged "
                            f"no {SPEC_ARTIFACT})")
        if spec.budget is None:
            raise _Mismatch(f"{self.where}'s run {run_id} has no ledger charge: its spec {spec.name} has no budget "
                            "section, so no ledger records what it spent")
        if spec.privacy is None:
            raise _Mismatch(f"{self.where}'s run {run_id} is not private (mechanism none): it has no guarantee to "
                            "verify")
        self.run, self.spec = run, spec
        return OK, f"run {run_id} of spec {spec.name}, charged to dataset {spec.budget.dataset!r}"

    def _ledger_charge(self) -> Tuple[str, str]:
        charge = self._charge_of(self.run.info.run_id, self.spec)
        self.charge = charge
        return OK, (f"charge {charge.id} on dataset {charge.dataset!r} in {shown_url(charge.ledger)}: committed, "
                    f"{charge.steps_run} of {charge.steps_planned} planned steps")

    def _epsilon(self) -> Tuple[str, str]:
        from flows.record.reporting import shown

        run_id, spec, charge = self.run.info.run_id, self.spec, self.charge
        tags, vtags = self.run.data.tags, self.version.tags or {}
        logged = self._artifact_event(run_id, DP_EVENT_ARTIFACT)
        if logged is None:
            raise _Mismatch(f"run {run_id} logged no {DP_EVENT_ARTIFACT}: what it spent is recorded only in the ledger")
        if logged != charge.executed:
            raise _Mismatch(f"run {run_id}'s {DP_EVENT_ARTIFACT} is not the event the ledger committed for it "
                            f"(charge {charge.id})")
        privacy = spec.privacy
        ledger_neighboring = self._dataset_neighboring(charge)
        expected = {DP_ACCOUNTANT: (privacy.accountant, "the run's spec accounts with"),
                    DP_NEIGHBORING: (privacy.neighboring, "the run's spec and the ledger's dataset are accounted "
                                       "under"),
                    DP_DELTA: (shown(float(privacy.delta), 6), "the run's spec has delta")}
        if ledger_neighboring is not None and ledger_neighboring != privacy.neighboring:
            raise _Mismatch(f"run {run_id}'s spec is accounted under {privacy.neighboring}, the ledger accounts "
                            f"dataset {charge.dataset!r} under {ledger_neighboring}")
        for owner, held in (("run", tags), (self.where, vtags)):
            for key, (value, says) in expected.items():
                if held.get(key) != value:
                    raise _Mismatch(f"{owner}'s {key} tag says {held.get(key)}, {says} {value}")
        eps = Accountant(privacy.accountant, privacy.neighboring).epsilon(charge.executed, float(privacy.delta))
        self.run_epsilon = eps
        composes = f"the ledger's committed event composes to {shown(eps, 6)}"
        if tags.get(DP_EPSILON) != shown(eps, 6):
            raise _Mismatch(f"run {run_id}'s dp.epsilon tag says {tags.get(DP_EPSILON)}, {composes}")
        if vtags.get(DP_RUN_EPSILON) != shown(eps, 6):
            raise _Mismatch(f"{self.where}'s dp.run_epsilon tag says {vtags.get(DP_RUN_EPSILON)}, {composes}")
        stated = _pair(tags.get(DP_GUARANTEE, ""))
        if spec.private and (stated is None or stated[0] != shown(eps)):
            raise _Mismatch(f"run {run_id}'s dp.guarantee states epsilon {stated[0] if stated else 'none'}, the "
                            f"ledger's committed event composes to {shown(eps)}")
        if vtags.get(DP_RUN_GUARANTEE) != tags.get(DP_GUARANTEE):
            raise _Mismatch(f"{self.where}'s dp.run_guarantee is not its run's dp.guarantee "
                            f"({vtags.get(DP_RUN_GUARANTEE)!r})")
        return OK, (f"the committed event composes to epsilon {shown(eps, 6)} at delta "
                    f"{shown(float(privacy.delta), 6)} ({privacy.accountant}, {privacy.neighboring}), as the run's "
                    "tags say")

    def _model_guarantee(self) -> Tuple[str, str]:
        from flows.record.lineage import model_epsilon
        from flows.record.reporting import shown

        run, spec, charge = self.run, self.spec, self.charge
        run_id, tags, vtags = run.info.run_id, run.data.tags, self.version.tags or {}
        self._start_agrees(run, spec, charge)
        composed, runs = self._model_event(run, spec, charge.executed)
        logged = self._artifact_event(run_id, MODEL_EVENT_ARTIFACT)
        if logged is None and composed is not None and runs > 1 and tags.get(DP_MODEL_EPSILON) == "inf":
            composed = None  # the run found a start's events unknown and says so: "unknown" is not a false claim
        if composed is not None and logged != composed:
            raise _Mismatch(f"run {run_id}'s {MODEL_EVENT_ARTIFACT} is not the composition of the ledger's committed events "
                            f"of the {runs} run{'s' if runs != 1 else ''} that trained the model")
        if composed is None and logged is not None:
            raise _Mismatch(f"run {run_id} logged a {MODEL_EVENT_ARTIFACT}, but the ledger does not record every run of its "
                            "lineage")
        model_eps = model_epsilon(spec, composed)
        window = [b for b in tags.get(PRIVZO_BLOCKS, "").split(",") if b]
        if window:
            expected_blocks = self._block_events(run, spec, window, charge.executed, composed)
            logged_blocks = self._artifact_text(run_id, MODEL_BLOCK_EVENTS_ARTIFACT)
            logged_blocks = None if logged_blocks is None else {
                b: event_from_json(t) for b, t in json.loads(logged_blocks).items()}
            if logged_blocks != expected_blocks:
                raise _Mismatch(f"run {run_id}'s {MODEL_BLOCK_EVENTS_ARTIFACT} is not the per-block composition of the "
                                "ledger's committed events of the runs that trained the model")
            blocks = len(expected_blocks or {})
            per_block = [model_epsilon(spec, e) for e in (expected_blocks or {}).values()]
            model_eps = max(per_block) if per_block else math.inf
        self.model_eps = model_eps
        headline = model_eps if spec.private else self.run_epsilon
        lineage = f"the ledger's committed events of its {runs} run{'s' if runs != 1 else ''} compose to"
        checks = [(tags, f"run {run_id}", DP_MODEL_EPSILON, model_eps), (vtags, self.where, DP_EPSILON, headline),
                  (vtags, self.where, DP_MODEL_EPSILON, model_eps)]
        for held, owner, key, value in checks:
            if held.get(key) != shown(value, 6):
                raise _Mismatch(f"{owner}'s {key} tag says {held.get(key)}, {lineage} {shown(value, 6)}")
        if tags.get(DP_MODEL_RUNS) != str(runs):
            raise _Mismatch(f"run {run_id}'s dp.model_runs tag says {tags.get(DP_MODEL_RUNS)}, its lineage has "
                            f"{runs} run{'s' if runs != 1 else ''}")
        self._guarantee_sentence(f"{self.where}'s dp.guarantee", vtags.get(DP_GUARANTEE, ""), model_eps, lineage)
        description = self.version.description or ""
        model_line = _paragraph_after(description, "**Model guarantee:** ")
        if model_line is None:
            raise _Mismatch(f"the description of {self.where} states no model guarantee")
        self._guarantee_sentence(f"the description of {self.where}", model_line, model_eps, lineage)
        run_line = _paragraph_after(description, f"**Run {run_id} spent:** ")
        if run_line is None:
            raise _Mismatch(f"the description of {self.where} does not state what run {run_id} spent")
        self._guarantee_sentence(f"the description of {self.where} (run {run_id} spent)", run_line,
                                 self.run_epsilon, "the ledger's committed event composes to")
        if model_line != vtags.get(DP_GUARANTEE) or run_line != tags.get(DP_GUARANTEE):
            raise _Mismatch(f"the description of {self.where} does not state its dp.guarantee tag as the model's "
                            f"guarantee and its run's dp.guarantee as what run {run_id} spent")
        return OK, (f"model epsilon {shown(model_eps, 6)} over {runs} run{'s' if runs != 1 else ''}"
                    + (f" (the largest of its {blocks} blocks)" if window else "")
                    + ", as the version's tags and description state")

    def _guarantee_sentence(self, what: str, sentence: str, eps: float, lineage: str) -> None:
        from flows.record.reporting import shown

        if not self.spec.private:
            return
        if not math.isfinite(eps):
            if not sentence.startswith("unknown:"):
                raise _Mismatch(f"{what} states a guarantee, but the ledger does not record every run of the model's "
                                "lineage (its guarantee is unknown)")
            return
        stated = _pair(sentence)
        if stated is None or stated[0] != shown(eps):
            said = f"({stated[0]}, {stated[1]})-DP" if stated else "no (epsilon, delta)"
            raise _Mismatch(f"{what} says {said}, {lineage} {shown(eps)}")
        delta = shown(float(self.spec.privacy.delta), 3)
        if stated[1] != delta:
            raise _Mismatch(f"{what} states delta {stated[1]}, the run's delta is {delta}")

    def _spec_and_fingerprint(self) -> Tuple[str, str]:
        from components import builders
        from specs.run import spec_digest

        run, spec, charge = self.run, self.spec, self.charge
        run_id, tags, params = run.info.run_id, run.data.tags, run.data.params
        logged = yaml.safe_load(self._artifact_text(run_id, SPEC_ARTIFACT) or "") or {}
        for key, value in specs.flatten(spec).items():
            if key not in params and not _holds(logged, key):
                continue  # a field privzo gained after this run was logged, read at its default
            if params.get(key) != value:
                raise _Mismatch(f"run {run_id}'s param {key} is {params.get(key)!r}, its {SPEC_ARTIFACT} says "
                                f"{value!r}")
        fingerprint = tags.get(DATA_FINGERPRINT)
        if fingerprint != charge.fingerprint:
            raise _Mismatch(f"run {run_id}'s data.fingerprint tag is {fingerprint}, the ledger charged rows of "
                            f"fingerprint {charge.fingerprint}")
        tagged = (self.version.tags or {}).get(DATA_FINGERPRINT)
        if tagged != fingerprint:
            raise _Mismatch(f"{self.where}'s data.fingerprint tag is {tagged}, its run's is {fingerprint}")
        if charge.run_name != spec.name:
            raise _Mismatch(f"the ledger charged run {run_id} as spec {charge.run_name!r}, its {SPEC_ARTIFACT} is "
                            f"{spec.name!r}")
        if charge.steps_planned != spec.optimizer.steps:
            raise _Mismatch(f"the ledger reserved {charge.steps_planned} steps for run {run_id}, its spec plans "
                            f"{spec.optimizer.steps}")
        if tags.get(DP_STEPS) != str(charge.steps_run):
            raise _Mismatch(f"run {run_id}'s dp.steps tag says {tags.get(DP_STEPS)}, the ledger committed "
                            f"{charge.steps_run} steps")
        n_private = params.get(DERIVED_N_PRIVATE)
        try:
            planned = builders.planned_event(spec, int(n_private) if n_private else None,
                                             float(spec.mechanism.noise_multiplier))
        except (ValueError, TypeError) as err:
            raise _Mismatch(f"run {run_id}'s spec does not plan an event: {str(err).splitlines()[0]}") from None
        if planned != charge.planned:
            raise _Mismatch(f"the ledger's reservation for run {run_id} planned another event than its spec plans "
                            "(noise, sampling or steps differ)")
        window = [b for b in tags.get(PRIVZO_BLOCKS, "").split(",") if b]
        if window and sorted(window) != sorted(charge.blocks):
            raise _Mismatch(f"run {run_id}'s privzo.blocks tag names {', '.join(window)}, the ledger charged it on "
                            f"{', '.join(charge.blocks)}")
        return OK, (f"params are the spec (digest {spec_digest(spec)[:12]}); the charge is for this spec and for the "
                    f"rows of data.fingerprint {fingerprint[:12]}")

    def _weights(self) -> Tuple[str, str]:
        import torch

        from components.directions import GENERATOR_VERSION
        from flows.record.transcript import (GPU_ATOL, GPU_RTOL, ReplayError, journal_is_trajectory, replay_device,
                                      replay_weights, start_of, transcript_in)

        spec, run = self.spec, self.run
        if not journal_is_trajectory(spec):
            return NOT_APPLICABLE, (f"{spec.estimator.kind} with {spec.optimizer.kind}: its updates are not a journal "
                                    "of seeded steps alone, so its weights cannot be replayed")
        run_id, tags = run.info.run_id, run.data.tags
        stream = tags.get(PRIVZO_DIRECTIONS_STREAM, f"cpu-torch-v{GENERATOR_VERSION}")
        try:
            if tags.get(PRIVZO_DIRECTIONS_VERSION) != str(GENERATOR_VERSION):
                raise ReplayError(f"run {run_id}'s journal was drawn by direction generator "
                                  f"v{tags.get(PRIVZO_DIRECTIONS_VERSION)}, this privzo draws v{GENERATOR_VERSION}: "
                                  "it cannot be replayed here")
            on_gpu = replay_device(stream, f"run {run_id}").type == "cuda"
        except ReplayError as err:
            raise _Mismatch(str(err)) from None
        journal_text = self._artifact_text(run_id, JOURNAL_ARTIFACT)
        if journal_text is None:
            raise _Mismatch(f"run {run_id} logged no journal ({JOURNAL_ARTIFACT})")
        entries = json.loads(journal_text)
        if self.charge is not None:
            self._journal_counted(run_id, entries)
        local = self._download(f"models:/{self.name}/{self.number}")
        try:
            transcript = None if local is None else transcript_in(local)
        except ReplayError as err:
            raise _Mismatch(f"{self.where} holds a transcript privzo cannot read: {err}") from None
        if transcript is not None:  # the replay is what the version is: check what it holds, then load it
            return self._transcript(local, transcript, entries, stream)
        registered = self._pytorch_model(local)
        if registered is None:
            raise _Mismatch(f"{self.where}'s model cannot be loaded")
        try:
            replayed, used = replay_weights(
                spec, entries, owner=f"run {run_id}", stream=stream, directions_version=str(GENERATOR_VERSION),
                start=start_of(tags.get(PRIVZO_INIT)), load_start=self._load_start)
        except ReplayError as err:
            raise _Mismatch(str(err)) from None
        # every tensor of the model the spec builds (a registered graph may hold constants of its own besides)
        mine, theirs = replayed.state_dict(), registered.state_dict()
        if set(mine) - set(theirs):
            raise _Mismatch(f"{self.where}'s weights are not the model its spec builds (it has no "
                            f"{', '.join(sorted(set(mine) - set(theirs))[:3])})")
        for key in mine:
            a, b = mine[key].detach().cpu(), theirs[key].detach().cpu()
            if a.shape != b.shape or a.dtype != b.dtype:
                raise _Mismatch(f"{self.where}'s weights are not the model its spec builds ({key}: {tuple(b.shape)} "
                                f"{b.dtype}, the spec builds {tuple(a.shape)} {a.dtype})")
            same = torch.equal(a, b) if not on_gpu else bool(torch.allclose(a, b, rtol=GPU_RTOL, atol=GPU_ATOL))
            if not same:
                gap = float((a.double() - b.double()).abs().max()) if a.is_floating_point() else float("nan")
                how = "bit for bit" if not on_gpu else f"within rtol {GPU_RTOL:g}, atol {GPU_ATOL:g}"
                raise _Mismatch(f"{self.where}'s weights are not the replay of run {run_id}'s journal from its "
                                f"{used} ({key} differs by up to {gap:.3g}; required {how})")
        return OK, (f"the weights are the replay of {len(entries)} journal entries from the {used}, "
                    + ("bit for bit (CPU)" if not on_gpu else f"within rtol {GPU_RTOL:g}, atol {GPU_ATOL:g} (GPU)"))

    def _journal_counted(self, run_id: str, entries: List[dict]) -> None:
        """The journal is the trajectory: every step it holds was a private step, so the ledger's committed
        charge must count exactly those. A worker that commits fewer steps than it ran (or "nothing ran")
        hides their epsilon while the weights, replayed from the journal, still pass."""
        per_step = int(self.spec.estimator.queries)
        committed = self.charge.steps_run
        steps = sorted({int(e["step"]) for e in entries})
        counted = f"its committed charge {self.charge.id} counts {committed} steps x {per_step} releases"
        if committed == 0 and entries:
            raise _Mismatch(f"run {run_id}'s journal holds {len(entries)} entries over {len(steps)} steps, and {counted}"
                            " (nothing ran): the weights were trained on steps the ledger does not count")
        if len(entries) != committed * per_step or steps != list(range(committed)):
            last = f", the last {steps[-1]}" if steps else ""
            raise _Mismatch(f"run {run_id}'s journal holds {len(entries)} entries over {len(steps)} steps{last}, and "
                            f"{counted} = {committed * per_step}: the weights were trained on steps the ledger does "
                            "not count as they ran")

    def _transcript(self, local: Path, transcript, entries: List[dict], stream: str) -> Tuple[str, str]:
        """A transcript version holds no weights: the replay of its journal is the model. It must hold what the run
        recorded (its spec, journal, directions and start), be privzo's pyfunc, and load: loading replays the
        journal and refuses weights whose SHA-256 is not the trained weights' (on a CPU stream)."""
        import mlflow.pyfunc

        from flows.record.transcript import ReplayError, TranscriptModel, start_of

        run_id, tags = self.run.info.run_id, self.run.data.tags
        held = {"run": (transcript.run_id, run_id),
                "spec": (transcript.spec, self._artifact_text(run_id, SPEC_ARTIFACT)),
                "journal": (transcript.entries(), entries), "directions stream": (transcript.directions_stream, stream),
                "direction generator": (transcript.directions_version, tags.get(PRIVZO_DIRECTIONS_VERSION)),
                "start": (transcript.start, start_of(tags.get(PRIVZO_INIT)))}
        for what, (theirs, recorded) in held.items():
            if theirs != recorded:
                raise _Mismatch(f"{self.where} is a transcript whose {what} is not run {run_id}'s, so it does not "
                                "replay the run's trajectory")
        try:  # as a user loads it: the pickled pyfunc's own load_context replays
            loaded = mlflow.pyfunc.load_model(str(local), model_config={"tracking_uri": self.uri})
        except ReplayError as err:
            raise _Mismatch(f"{self.where} is a transcript that does not load: {err}") from None
        python_model = loaded.unwrap_python_model()
        if type(python_model) is not TranscriptModel:
            raise _Mismatch(f"{self.where} holds a transcript, but its pyfunc is {type(python_model).__qualname__}, "
                            "not privzo's TranscriptModel: loading it need not replay the journal")
        on_gpu = transcript.directions_stream.startswith("cuda")
        how = ("equal bit for bit (CPU) to the weights it registered (their SHA-256)" if not on_gpu else
               "on a GPU (its rounding differs from run to run, so the registered SHA-256 is not compared)")
        return OK, (f"a transcript, no weights: loading it replays {len(entries)} journal entries from the "
                    f"{python_model.started}, {how}")

    # ------------------------------------------------------------ lineage
    def _start_agrees(self, run, spec: specs.RunSpec, charge, seen: Optional[set] = None) -> None:
        """The start a run names twice agrees, back to a seed start: the weights are replayed from the version
        ``privzo.init`` names and the history composed from the run ``privzo.init_run_id`` names, so both must
        be that one version of this model, whose run was charged on the same ledger and dataset, and so on
        recursively (a start trained outside the ledger, then continued honestly, is caught here)."""
        seen = set() if seen is None else seen
        run_id, tags = run.info.run_id, run.data.tags
        if run_id in seen:
            raise _Mismatch(f"run {run_id}'s lineage returns to itself")
        seen.add(run_id)
        init, source_id = tags.get(PRIVZO_INIT, "seed"), tags.get(PRIVZO_INIT_RUN_ID)
        if not init.startswith("models:/"):
            if source_id is not None:
                raise _Mismatch(f"run {run_id} says it started from the {init!r} but names start run {source_id}")
            return
        name, _, number = init[len("models:/"):].rpartition("/")
        if name != self.name:
            raise _Mismatch(f"run {run_id} started from {init}, a version of another model than {self.name}")
        try:
            start = self.client.get_model_version(name, number)
        except Exception:  # noqa: BLE001 - a start that is gone cannot be checked
            raise _Mismatch(f"run {run_id} started from {init}, which does not exist in {self.uri}") from None
        if source_id is None or start.run_id != source_id:
            raise _Mismatch(f"run {run_id} started from {init} (the weights replayed), whose run is {start.run_id}, but "
                            f"composes its privacy history from run {source_id} (privzo.init_run_id)")
        source, source_spec = self._get_run(source_id), self._spec_of(source_id)
        if source is None or source_spec is None or source_spec.budget is None or source_spec.privacy is None:
            raise _Mismatch(f"run {run_id} started from {init}, whose run {source_id} has no ledger charge")
        if source_spec.budget.dataset != spec.budget.dataset:
            raise _Mismatch(f"run {run_id} started from {init}, charged to dataset {source_spec.budget.dataset!r}, "
                            f"not {spec.budget.dataset!r}")
        source_charge = self._charge_of(source_id, source_spec)
        if source_charge.ledger != charge.ledger:
            raise _Mismatch(f"run {run_id} started from {init}, charged to {shown_url(source_charge.ledger)}, not "
                            f"{shown_url(charge.ledger)}")
        self._start_agrees(source, source_spec, source_charge, seen)

    def _model_event(self, run, spec: specs.RunSpec, event) -> Tuple[Optional[dp_accounting.DpEvent], int]:
        """The model's composed event as ``flows.record.lineage.model_event`` builds it, every run's event taken
        from the ledger's committed charge; and the number of runs that trained it."""
        source_id = run.data.tags.get(PRIVZO_INIT_RUN_ID)
        if source_id is None:
            return event, 1
        source = self._get_run(source_id)
        if source is None:
            return None, 2
        if source.data.tags.get(DP_NEIGHBORING) != spec.privacy.neighboring:
            return None, 2
        source_spec = self._spec_of(source_id)
        if source_spec is None or source_spec.budget is None or source_spec.privacy is None:
            raise _Mismatch(f"the model continues run {source_id}, which has no ledger charge: its epsilon is not in "
                            "the ledger")
        before, runs = self._model_event(source, source_spec, self._charge_of(source_id, source_spec).executed)
        if before is None:
            return None, runs + 1
        return dp_accounting.ComposedDpEvent([before, event]), runs + 1

    def _block_events(self, run, spec: specs.RunSpec, window: List[str], event, composed):
        """Per block, as ``flows.record.lineage.model_block_events`` composes them, from the ledger."""
        source_id = run.data.tags.get(PRIVZO_INIT_RUN_ID)
        if source_id is None:
            return {block: event for block in window}
        source = self._get_run(source_id)
        source_window = [b for b in (source.data.tags.get(PRIVZO_BLOCKS, "") if source else "").split(",") if b]
        if source is None or not source_window:
            return None if composed is None else {block: composed for block in window}
        source_spec = self._spec_of(source_id)
        if source_spec is None or source_spec.budget is None or source_spec.privacy is None:
            raise _Mismatch(f"the model continues run {source_id}, which has no ledger charge: its epsilon is not in "
                            "the ledger")
        source_event = self._charge_of(source_id, source_spec).executed
        source_composed, _ = self._model_event(source, source_spec, source_event)
        before = self._block_events(source, source_spec, source_window, source_event, source_composed)
        if before is None:
            return None if composed is None else {block: composed for block in window}
        return {**before, **{block: dp_accounting.ComposedDpEvent([before[block], event]) if block in before
                             else event for block in window}}

    # ------------------------------------------------------------ reading MLflow and the ledger
    def _get_run(self, run_id: str):
        if run_id not in self._runs:
            try:
                self._runs[run_id] = self.client.get_run(run_id)
            except MlflowException:
                self._runs[run_id] = None
        return self._runs[run_id]

    def _artifact_text(self, run_id: str, path: str) -> Optional[str]:
        target = self.folder / run_id / path
        if not target.exists():
            try:
                local = self.client.download_artifacts(run_id, path, str(self.folder / run_id))
            except (MlflowException, OSError):
                return None
            target = Path(local)
        return target.read_text() if target.is_file() else None

    def _artifact_event(self, run_id: str, path: str) -> Optional[dp_accounting.DpEvent]:
        text = self._artifact_text(run_id, path)
        if text is None:
            return None
        try:
            return event_from_json(text)
        except (ValueError, TypeError, KeyError) as err:
            raise _Mismatch(f"run {run_id}'s {path} is not a DpEvent ({str(err).splitlines()[0]})") from None

    def _spec_of(self, run_id: str) -> Optional[specs.RunSpec]:
        if run_id not in self._specs:
            text = self._artifact_text(run_id, SPEC_ARTIFACT)
            if text is None:
                self._specs[run_id] = None
            else:
                try:
                    self._specs[run_id] = specs.spec_from_dict(yaml.safe_load(text))
                except (specs.SpecError, ValueError, yaml.YAMLError) as err:
                    raise _Mismatch(f"run {run_id}'s {SPEC_ARTIFACT} is not a valid spec: "
                                    f"{str(err).splitlines()[0]}") from None
        return self._specs[run_id]

    def _ledger(self, spec: specs.RunSpec):
        """The ledger to read, never created where it does not exist: the one given, else the team's
        ($PRIVZO_LEDGER_URL: a version in the team's registry is checked against the team's ledger, not against
        one its spec names, which whoever ran it chose), else the spec's."""
        from sqlalchemy.engine import make_url

        from specs.run import without_passwords
        from specs.sections import LEDGER_URL_ENV

        url = self.override or os.environ.get(LEDGER_URL_ENV, "").strip() or spec.budget.ledger
        if ":***@" in url:  # logged without its password (specs.run.without_passwords): the caller's own URL
            own = os.environ.get(LEDGER_URL_ENV, "")
            if not own or without_passwords(own) != url:
                raise _Mismatch(f"the run's spec names its ledger {url} without its password; give --ledger with "
                                f"credentials that may read it, or set ${LEDGER_URL_ENV} to it")
            url = own
        if url not in self._ledgers:
            parsed = make_url(url)
            if parsed.get_backend_name() == "sqlite" and parsed.database and not os.path.exists(parsed.database):
                raise _Mismatch(f"ledger {shown_url(url)} does not exist (no file {parsed.database}), so no charge "
                                "records what the run spent")
            self._ledgers[url] = PrivacyLedger.open(url)
        return self._ledgers[url], url

    def _charge_of(self, run_id: str, spec: specs.RunSpec) -> Charge:
        """The committed charge of ``run_id`` on the spec's dataset; a mismatch if there is none."""
        if run_id in self._charges:
            return self._charges[run_id]
        ledger, url = self._ledger(spec)
        dataset = spec.budget.dataset
        rows = ledger.run_charges(run_id)  # the ledger's own query: verify reads none of its tables
        live = [r for r in rows if r.dataset == dataset and r.status != ABORTED]
        if not live:
            elsewhere = sorted({r.dataset for r in rows if r.dataset != dataset and r.status != ABORTED})
            if elsewhere:
                raise _Mismatch(f"run {run_id} is charged to dataset {elsewhere[0]!r} in {shown_url(url)}, its spec "
                                f"names {dataset!r}")
            if rows:
                raise _Mismatch(f"run {run_id}'s charge {rows[-1].id} in {shown_url(url)} was aborted: the ledger "
                                "counts nothing for it")
            raise _Mismatch(f"run {run_id} has no charge in ledger {shown_url(url)} (dataset {dataset!r}): nothing "
                            "there records what it spent")
        if len(live) > 1:
            raise _Mismatch(f"run {run_id} has {len(live)} charges on dataset {dataset!r} in {shown_url(url)}; a run "
                            "is charged once")
        charge = live[0]
        if charge.status != COMMITTED:
            raise _Mismatch(f"run {run_id}'s charge {charge.id} in {shown_url(url)} is {charge.status}, not committed: "
                            "the run did not finish (or is still running)")
        # what a run executed is its reservation's plan cut to the steps it ran: the worker wrote the executed
        # event at commit, the plan at reservation, from the spec the run's (immutable) params hold
        beyond = beyond_plan(charge.planned, charge.executed, (charge.steps_planned, charge.steps_run))
        if beyond is not None:
            raise _Mismatch(f"run {run_id}'s charge {charge.id} in {shown_url(url)} committed an event beyond the one "
                            f"it reserved: {beyond}")
        # a block's stored composition is what admits later runs: it must be what its charges compose to
        changed = recomposition_problems(ledger, dataset, charge.blocks)
        if changed:
            raise _Mismatch(f"{changed[0]} ({shown_url(url)})")
        self._charges[run_id] = charge
        return charge

    def _dataset_neighboring(self, charge: Charge) -> Optional[str]:
        ds = self._ledgers[charge.ledger].dataset(charge.dataset)
        return None if ds is None else ds.neighboring

    # ------------------------------------------------------------ weights
    def _download(self, model_uri: str) -> Optional[Path]:
        from flows.record.transcript import download_version

        try:
            return download_version(model_uri, self.uri, self.folder)
        except (MlflowException, OSError):
            return None

    @staticmethod
    def _pytorch_model(local: Optional[Path]):
        import mlflow.pytorch

        try:
            return None if local is None else mlflow.pytorch.load_model(str(local), map_location="cpu")
        except (MlflowException, OSError):
            return None

    def _load_start(self, ref: str):
        """The version a run continued (``models:/NAME/VERSION``), weights or transcript; None where it cannot
        be loaded (a transcript's own reason is raised)."""
        from flows.record.transcript import ReplayError, load_weights

        try:
            return load_weights(ref, tracking_uri=self.uri, folder=self.folder)
        except ReplayError:
            raise
        except (MlflowException, OSError, ValueError):
            return None
