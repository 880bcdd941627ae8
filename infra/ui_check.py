"""Browser check of privzo's UIs: what a user finds in MLflow and Prefect after the main job and two nightly
retrains, driven in headless Chromium (Debian's, through Playwright).

    .venv/bin/python infra/ui_check.py [--quick] [--screenshots DIR] [--workdir DIR] [--keep-going]

Starts infra/local-stack.sh on free ports with its stores in a scratch folder, runs
specs/examples/digits_dpzero.yaml with `privzo run` and the digits-retrain-nightly deployment three times,
then opens the experiment, run, chart, model and Prefect pages and asserts what each must show. The stack
runs with its authentication on (PRIVZO_STACK_AUTH=1, secrets made for the check): the browser signs in to
MLflow as its read-only user viewer and to Prefect through its login page, after checking that neither
shows anything without. --quick trains one epoch per run. Importable: check(workdir, quick, screenshots) returns what it verified and raises
AssertionError naming the page and what was missing (with FAILED-<page>.png beside the screenshots).
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

import yaml

from flows.record.tracking_names import (DP_DELTA, DP_EPSILON, DP_GUARANTEE, DP_MODEL_EPSILON, DP_RUN_EPSILON,
                                  MLFLOW_EXPERIMENT_KIND, MLFLOW_RUN_NOTE, MLFLOW_SOURCE_NAME)

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
STACK = ROOT / "infra" / "local-stack.sh"
STATE = ROOT / ".privzo-stack"
DEPLOYMENT = "private-train/digits-retrain-nightly"
RETRAIN, MAIN = "digits-retrain", "digits-dpzero"
# two: version 2 continues version 1, a lineage whose composed epsilon the UI shows before the run's own
RETRAINS = 2

CHROMIUM_ENV = "PRIVZO_CHROMIUM"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1400, "height": 900}
FIRST_LOAD_MS = 60_000  # a cold MLflow or Prefect UI parses megabytes of JavaScript before it renders (slower
# while other tests share the CPU)
THEN_MS = 8_000  # the rest of a page once its first element is there
SHOT_BYTES = 300_000
SHOT_MAX_HEIGHT = 4_000

# the servers' startup, not what is checked: one MLflow worker process, a worker that polls every second
QUICK_STACK = {"MLFLOW_WORKERS": "1", "PREFECT_WORKER_QUERY_SECONDS": "1"}

# MLflow 3.17's UI opens an experiment in the view of the browser's workflow switch (GenAI unless the person
# switched to "Model training", remembered in localStorage), whatever the experiment's mlflow.experimentKind
# tag says; a link that shows a fresh browser the training runs names the view
EXPERIMENT_VIEW = "?workflowType=machine_learning"

# the MLflow Assistant opens itself on a browser's first visit and covers a third of every page
QUIET_MLFLOW = """
try {
  localStorage.setItem('mlflow.assistant.fab.autoOpenedOnFirstLoad_v1', 'true');
  localStorage.setItem('mlflow.assistant.panelOpen_v1', 'false');
} catch (e) {}
"""


class StackInUse(RuntimeError):
    """Another local stack keeps its state in .privzo-stack: a second `up` would take over its pid files."""


def chromium() -> str:
    return os.environ.get(CHROMIUM_ENV) or "/usr/bin/chromium"


def browser_problem() -> Optional[str]:
    """Why no browser check can run here (None when Chromium starts under Playwright)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return "playwright is not installed (pip install playwright; never `playwright install`)"
    exe = chromium()
    if not Path(exe).exists():
        return f"no Chromium at {exe} (set {CHROMIUM_ENV})"
    try:
        with sync_playwright() as p:
            p.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS).close()
    except Exception as err:  # any failure to start is a reason to skip, not a finding
        return f"Chromium at {exe} does not start: {str(err).strip().splitlines()[0]}"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else "..." + text[-limit:]


def _stack_running() -> bool:
    for pid_file in STATE.glob("*.pid"):
        try:
            os.killpg(int(pid_file.read_text().strip()), 0)
            return True
        except PermissionError:  # alive, someone else's
            return True
        except (ValueError, ProcessLookupError):
            continue
    return False


@contextlib.contextmanager
def local_stack(workdir: Path) -> Iterator[Dict[str, str]]:
    """infra/local-stack.sh up on free ports, MLflow and the ledger in ``workdir`` (down after); yields the
    environment a user would have after exporting what `up` prints."""
    if _stack_running():
        raise StackInUse(f"a local stack is running from {STATE} (make down first)")
    state_existed = STATE.exists()
    tracking, ledger = f"sqlite:///{workdir / 'mlflow.db'}", f"sqlite:///{workdir / 'ledger.db'}"
    env = {**QUICK_STACK, **os.environ}
    for name in ("PREFECT_API_URL", "PREFECT_PROFILE"):
        env.pop(name, None)
    env.update(PRIVZO_PREFECT_PORT=str(free_port()), PRIVZO_MLFLOW_PORT=str(free_port()),
               PREFECT_HOME=str(workdir / "prefect-home"), PRIVZO_STACK_MLFLOW_STORE=tracking,
               PRIVZO_STACK_MLFLOW_ARTIFACTS=str(workdir / "mlartifacts"),
               MLFLOW_TRACKING_URI=tracking, PRIVZO_LEDGER_URL=ledger, PRIVZO_STACK_AUTH="1",
               PRIVZO_PREFECT_AUTH_STRING=f"admin:{secrets.token_hex(12)}",
               **{f"PRIVZO_MLFLOW_{user}_PASSWORD": secrets.token_hex(12) for user in ("ADMIN", "WORKER", "VIEWER")})
    # rows are fingerprinted under a key of this check's own, not this user's ~/.privzo key
    env.setdefault("PRIVZO_FINGERPRINT_KEY", secrets.token_hex(32))
    try:
        try:
            up = subprocess.run(["bash", str(STACK), "up"], env=env, capture_output=True, text=True, timeout=400,
                                cwd=ROOT)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"local-stack.sh up did not finish in 400 s (logs: {STATE})") from None
        assert up.returncode == 0, f"local-stack.sh up failed: {_one_line(up.stderr or up.stdout)}"
        for line in up.stdout.splitlines():
            if line.startswith("export "):  # secrets are exported by name ("$PRIVZO_..."), never by value
                for name, value in (item.split("=", 1) for item in line.split()[1:] if "=" in item):
                    value = value.strip('"')
                    env[name] = env[value[1:]] if value.startswith("$") else value
        yield env
    finally:
        subprocess.run(["bash", str(STACK), "down"], env=env, capture_output=True, timeout=120, cwd=ROOT)
        if not state_existed:
            shutil.rmtree(STATE, ignore_errors=True)


def _spec_copies(workdir: Path, quick: bool) -> Dict[str, Path]:
    examples = ROOT / "specs" / "examples"
    main = yaml.safe_load((examples / "digits_dpzero.yaml").read_text())
    main["tracking"]["uri"] = f"sqlite:///{workdir / 'mlflow.db'}"
    retrain = yaml.safe_load((examples / "digits_retrain.yaml").read_text())
    # the worker's MLFLOW_TRACKING_URI and its ledger (the stack's worker.json, from the exported
    # PRIVZO_LEDGER_URL) decide where retrains go, as on a team's stack
    retrain.get("tracking", {}).pop("uri", None)
    retrain.get("budget", {}).pop("ledger", None)
    if quick:
        main["optimizer"]["epochs"] = retrain["optimizer"]["epochs"] = 1
        main["execution"] = {"backend": "local"}
    paths = {MAIN: workdir / "main.yaml", RETRAIN: workdir / "retrain.yaml"}
    paths[MAIN].write_text(yaml.safe_dump(main, sort_keys=False))
    paths[RETRAIN].write_text(yaml.safe_dump(retrain, sort_keys=False))
    return paths


def run_jobs(env: Dict[str, str], workdir: Path, quick: bool) -> List[str]:
    """The main job with `privzo run`, and the nightly deployment RETRAINS times. With --quick the main job
    (one epoch: mostly imports) runs beside the deployment runs, which mostly wait on the worker."""
    specs = _spec_copies(workdir, quick)
    done = []
    started = time.monotonic()
    log = workdir / "main-job.log"
    with open(log, "w") as out:
        main = subprocess.Popen([str(BIN / "privzo"), "run", str(specs[MAIN]), "--no-progress"], env=env,
                                cwd=workdir, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        if not quick:
            _finish_main(main, log, started, 1800, done)
        for i in range(1, RETRAINS + 1):
            began = time.monotonic()
            try:
                run = subprocess.run([str(BIN / "prefect"), "deployment", "run", DEPLOYMENT, "--param",
                                      f"spec_path={specs[RETRAIN]}", "--watch", "--watch-timeout", "600"],
                                     env=env, cwd=ROOT, capture_output=True, text=True, timeout=700)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"deployment run {i} of {DEPLOYMENT} did not end in 700 s") from None
            assert run.returncode == 0 and "Completed" in run.stdout, \
                f"deployment run {i} of {DEPLOYMENT} did not complete: {_one_line(run.stdout + run.stderr)}"
            done.append(f"deployment run {i}: {DEPLOYMENT} Completed in {time.monotonic() - began:.0f} s")
        if quick:
            _finish_main(main, log, started, 600, done)
    finally:
        if main.poll() is None:
            os.killpg(main.pid, 15)
            main.wait(30)
    return done


def _finish_main(main: subprocess.Popen, log: Path, started: float, limit: float, done: List[str]) -> None:
    try:
        main.wait(max(1.0, limit - (time.monotonic() - started)))
    except subprocess.TimeoutExpired:
        raise AssertionError(f"privzo run {MAIN} did not finish in {limit:.0f} s (log: {log})") from None
    assert main.returncode == 0, f"privzo run {MAIN} failed: {_one_line(log.read_text())}"
    done.insert(0, f"main job: privzo run {MAIN} finished in {time.monotonic() - started:.0f} s")


@dataclass
class Facts:
    """Ids and values read through the MLflow and Prefect clients, never from the UIs under test."""

    mlflow_ui: str
    prefect_ui: str
    experiment_id: str
    experiment_tags: Dict[str, str]
    runs: list  # the retrain experiment's runs, newest first
    version: object  # registered version RETRAINS of the retrain model
    deployment_id: str
    flow_runs: list  # the deployment's flow runs, newest first
    artifact_id: Optional[str]
    mlflow_log_line: Optional[str]  # the flow run's "MLflow run: ..." log line, if it logged one
    mlflow_user: Optional[str] = None  # with the stack's authentication on: who the browser signs in as
    mlflow_password: Optional[str] = None
    prefect_auth: Optional[str] = None

    @property
    def latest(self):
        return self.runs[0]

    def run_url(self, run) -> str:
        return f"{self.mlflow_ui}/#/experiments/{self.experiment_id}/runs/{run.info.run_id}"


def read_facts(env: Dict[str, str]) -> Facts:
    import mlflow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (ArtifactFilter, ArtifactFilterFlowRunId, DeploymentFilter,
                                                DeploymentFilterId, LogFilter, LogFilterFlowRunId)
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    # read as the user the stack's exports name (viewer): MLflow's client takes it from the process environment
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        if name in env:
            os.environ[name] = env[name]
    client = mlflow.MlflowClient(env["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name(RETRAIN)
    assert experiment is not None, f"MLflow store has no experiment {RETRAIN}"
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time DESC"])
    assert len(runs) == RETRAINS, f"experiment {RETRAIN} holds {len(runs)} runs, not {RETRAINS}"
    assert all(r.info.status == "FINISHED" for r in runs), f"{RETRAIN} runs not all FINISHED"
    versions = {str(v.version): v for v in client.search_model_versions(f"name='{RETRAIN}'")}
    assert str(RETRAINS) in versions, f"model {RETRAIN} has versions {sorted(versions)}, not {RETRAINS}"
    version = client.get_model_version(RETRAIN, str(RETRAINS))
    assert version.run_id == runs[0].info.run_id, f"{RETRAIN} version {RETRAINS} is not the latest run's model"
    main_exp = client.get_experiment_by_name(MAIN)
    main_runs = client.search_runs([main_exp.experiment_id]) if main_exp else []
    assert main_runs and main_runs[0].info.status == "FINISHED", f"no FINISHED {MAIN} run in the MLflow store"

    api = env["PREFECT_API_URL"]
    auth = {PREFECT_API_AUTH_STRING: env["PREFECT_API_AUTH_STRING"]} if env.get("PREFECT_API_AUTH_STRING") else {}
    with temporary_settings(updates={PREFECT_API_URL: api, **auth}), get_client(sync_client=True) as prefect:
        deployment = prefect.read_deployment_by_name(DEPLOYMENT)
        flow_runs = prefect.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])),
            sort=FlowRunSort.START_TIME_DESC, limit=20)
        assert len(flow_runs) >= RETRAINS, f"deployment {DEPLOYMENT} has {len(flow_runs)} flow runs"
        last = flow_runs[0]
        artifacts = prefect.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[last.id])))
        markdown = [a for a in artifacts if a.type == "markdown"]
        logs = prefect.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[last.id])))
    line = next((log.message for log in logs if "MLflow run:" in log.message), None)
    artifact = max(markdown, key=lambda a: a.created) if markdown else None
    return Facts(mlflow_ui=f"http://127.0.0.1:{env['PRIVZO_MLFLOW_PORT']}",
                 prefect_ui=api[: -len("/api")] if api.endswith("/api") else api,
                 mlflow_user=env.get("MLFLOW_TRACKING_USERNAME"), mlflow_password=env.get("MLFLOW_TRACKING_PASSWORD"),
                 prefect_auth=env.get("PREFECT_API_AUTH_STRING"),
                 experiment_id=experiment.experiment_id, experiment_tags=dict(experiment.tags), runs=runs,
                 version=version, deployment_id=str(deployment.id), flow_runs=flow_runs,
                 artifact_id=str(artifact.id) if artifact else None, mlflow_log_line=line)


# --- the browser -----------------------------------------------------------------------------------------

# how much taller than the window the page's content is, counting MLflow's and Prefect's inner scroll panes
CONTENT_EXTRA_JS = """() => {
  let extra = document.documentElement.scrollHeight - window.innerHeight;
  for (const el of document.querySelectorAll('*')) {
    const s = getComputedStyle(el);
    if ((s.overflowY === 'auto' || s.overflowY === 'scroll') && el.clientHeight > 200)
      extra = Math.max(extra, el.scrollHeight - el.clientHeight);
  }
  return Math.max(0, extra);
}"""

# (y, DOM index) of the element showing tag `key` with `value` (a run's tag chip "key: value" or a
# registered version's table row "key  value"), or null
TAG_JS = """([key, value]) => {
  const norm = s => (s || '').replace(/\\s+/g, ' ').trim();
  const all = [...document.querySelectorAll('body *')];
  for (const el of all) {
    if (el.children.length !== 0 || norm(el.textContent) !== key) continue;
    let box = el;
    for (let i = 0; i < 5 && box; i++, box = box.parentElement) {
      const text = norm(box.innerText);
      if (!text.startsWith(key) || text.length > key.length + value.length + 12) continue;
      const rest = text.slice(key.length).replace(/^[\\s:]+/, '').trim();
      if (rest === value || rest.startsWith(value + ' ')) {
        const r = box.getBoundingClientRect();
        return [r.top + window.scrollY, all.indexOf(box)];
      }
    }
  }
  return null;
}"""

# (y, DOM index) of the first element whose own text contains `text`, or null
TEXT_AT_JS = """(text) => {
  const all = [...document.querySelectorAll('body *')];
  for (const el of all) {
    const own = [...el.childNodes].filter(n => n.nodeType === 3).map(n => n.textContent).join('');
    if (own.includes(text)) { const r = el.getBoundingClientRect(); return [r.top + window.scrollY, all.indexOf(el)]; }
  }
  return null;
}"""

# the texts of table `i`'s cells that lie beyond the right edge of what shows them (a scroll box or the window)
CLIPPED_JS = """(i) => {
  const table = document.querySelectorAll('table')[i];
  let right = window.innerWidth;
  for (let e = table.parentElement; e; e = e.parentElement)
    if (getComputedStyle(e).overflowX !== 'visible') right = Math.min(right, e.getBoundingClientRect().right);
  return [...table.querySelectorAll('th, td')]
    .filter(c => c.getBoundingClientRect().right > right + 1 && c.innerText.trim())
    .map(c => c.innerText.trim());
}"""

# every table's rows as text, for the artifact's budget table
TABLES_JS = """() => [...document.querySelectorAll('table')].map(t =>
  [...t.querySelectorAll('tr')].map(r => r.innerText.replace(/\\s+/g, ' ').trim()))"""


class Browser:
    """One Chromium page; every visit is screenshotted, a failing one as FAILED-<name>.png."""

    def __init__(self, page, screenshots: Optional[Path]):
        self.page, self.screenshots = page, screenshots
        self.focus = None  # brings into view what a page's picture must show when the whole page is too big

    def shot(self, name: str) -> None:
        from playwright.sync_api import Error as PlaywrightError

        if self.screenshots is None:
            return
        path = self.screenshots / f"{name}.png"
        page = self.page
        try:
            # MLflow and Prefect scroll inside a pane: a taller window shows the whole page in one picture
            extra = int(page.evaluate(CONTENT_EXTRA_JS))
            if extra > 0:
                page.set_viewport_size({"width": VIEWPORT["width"],
                                        "height": min(VIEWPORT["height"] + extra, SHOT_MAX_HEIGHT)})
                page.wait_for_timeout(700)
            page.screenshot(path=str(path), full_page=True)
            if path.stat().st_size > SHOT_BYTES:  # the window alone, showing what the page is about
                page.set_viewport_size(VIEWPORT)
                page.wait_for_timeout(500)
                if self.focus is not None:
                    with contextlib.suppress(AssertionError, PlaywrightError):
                        self.focus()
                page.screenshot(path=str(path))
        except Exception as err:  # a picture that cannot be taken must not hide the finding
            print(f"screenshot {path.name} not taken: {_one_line(str(err), 200)}", file=sys.stderr)
        finally:
            page.set_viewport_size(VIEWPORT)

    def visit(self, name: str, url: str, checks: Callable[["Browser"], str]) -> str:
        from playwright.sync_api import Error as PlaywrightError

        self.focus = None
        try:
            # a blank page between visits: a route change inside the single-page app could leave the last
            # page's text in place for a check to find; no wait for network idle, both UIs poll their servers
            self.page.goto("about:blank")
            self.page.goto(url, wait_until="domcontentloaded", timeout=FIRST_LOAD_MS)
            summary = checks(self)
        except (AssertionError, PlaywrightError) as err:
            self.shot(f"FAILED-{name}")
            message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise AssertionError(f"{name} ({url}): {message}") from None
        self.page.wait_for_timeout(800)  # charts and tables finish drawing after their first element shows
        self.shot(name)
        if self.screenshots is not None:  # a page that passes again is no longer shown as failing
            (self.screenshots / f"FAILED-{name}.png").unlink(missing_ok=True)
        return summary

    # waits that fail with one line saying what a user would miss
    def text(self, text, what: str, timeout: int = THEN_MS, exact: bool = False):
        return self._shown(self.page.get_by_text(text, exact=exact), what, timeout)

    def element(self, selector: str, what: str, timeout: int = THEN_MS, has_text=None):
        return self._shown(self.page.locator(selector, has_text=has_text), what, timeout)

    @staticmethod
    def _shown(locator, what: str, timeout: int):
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        locator = locator.filter(visible=True).first
        try:
            locator.wait_for(state="visible", timeout=timeout)
        except PlaywrightTimeout:
            raise AssertionError(f"{what} not shown") from None
        return locator

    def tag(self, key: str, value: str, what: str):
        deadline = time.monotonic() + THEN_MS / 1000
        while True:
            at = self.page.evaluate(TAG_JS, [key, value])
            if at is not None:
                return at
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} (tag {key}: {value}) not shown")
            self.page.wait_for_timeout(250)

    def description(self, what: str) -> str:
        box = self.element('[data-testid="note-editor-preview-content"]', f"{what} description")
        return " ".join(box.inner_text().split())


def _close(a: str, b: str, rel: float = 5e-3) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=rel)
    except ValueError:
        return False


def _run_epsilon(tags: Dict[str, str]) -> tuple:
    """(tag key, value) of a run's own epsilon: dp.run_epsilon where privzo names it, else dp.epsilon."""
    key = DP_RUN_EPSILON if DP_RUN_EPSILON in tags else DP_EPSILON
    return key, tags[key]


def page_checks(f: Facts) -> List[tuple]:
    """(name, url, checks) per page, in the order a user would browse them."""
    latest, version = f.latest, f.version
    run_url = f.run_url(latest)
    names = [r.info.run_name for r in f.runs]

    def experiment(b: Browser) -> str:
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        try:  # the runs table's header: the experiment opened on its training runs
            b.page.get_by_text("Run Name", exact=True).first.wait_for(state="visible", timeout=FIRST_LOAD_MS)
        except PlaywrightTimeout:
            genai = b.page.get_by_text("No data available").count() > 0
            raise AssertionError("training runs list not shown" + (" (GenAI overview instead)" if genai else ""))
        kind = f.experiment_tags.get(MLFLOW_EXPERIMENT_KIND)
        assert kind == "custom_model_development", \
            f"experiment tag mlflow.experimentKind is {kind!r}, not 'custom_model_development'"
        pattern = re.compile(rf"^\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d {re.escape(RETRAIN)}$")
        bad = [n for n in names if not pattern.match(n or "")]
        assert not bad, f"run names {bad} are not '<UTC yyyy-mm-dd hh:mm:ss> {RETRAIN}'"
        assert len(set(names)) == len(names), f"run names repeat: {names}"
        for name in names:
            b.text(name, f"run {name} in the runs list", exact=True)
        return f"{len(names)} runs listed: {', '.join(names)}"

    def run(b: Browser) -> str:
        tags = latest.data.tags
        b.text("Run ID", "run details", timeout=FIRST_LOAD_MS)
        b.text(tags[DP_GUARANTEE], f"guarantee sentence {tags[DP_GUARANTEE]!r}")
        b.tag(DP_EPSILON, tags[DP_EPSILON], "run epsilon")
        b.tag(DP_DELTA, tags[DP_DELTA], "run delta")
        note = tags.get(MLFLOW_RUN_NOTE)
        assert note, f"run has no description (tag {MLFLOW_RUN_NOTE})"
        shown = b.description("run")  # rendered from markdown: what a reader sees
        assert shown.startswith("Model guarantee:"), f"run description shows {shown[:60]!r}"
        # MLflow's own fields: Source (what ran) and Datasets (what it read: the source, no row)
        b.text(tags[MLFLOW_SOURCE_NAME], f"Source {tags[MLFLOW_SOURCE_NAME]!r}")
        inputs = latest.inputs.dataset_inputs if latest.inputs else []
        assert inputs, "the run logged no dataset input"
        dataset = inputs[0].dataset.name
        b.text(dataset, f"Datasets {dataset!r}")
        return f"{latest.info.run_id[:8]}: {tags[DP_GUARANTEE]} epsilon {tags[DP_EPSILON]} delta " \
               f"{tags[DP_DELTA]}; description {shown[:50]!r}; source and dataset {dataset!r} shown"

    def charts(b: Browser) -> str:
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        found = []
        for metric in ("eval/accuracy", "privacy/epsilon"):
            legend = f"{latest.info.run_name} ({metric})"
            card = b.element('[data-testid="experiment-view-compare-runs-card"]', f"chart of {metric}",
                             timeout=FIRST_LOAD_MS if not found else THEN_MS, has_text=legend)
            plot = card.locator("svg.main-svg").first
            try:
                plot.wait_for(state="visible", timeout=THEN_MS)
            except PlaywrightTimeout:
                raise AssertionError(f"chart of {metric} has no plot") from None
            assert card.locator(".scatterlayer .trace").count() > 0, f"chart of {metric} plots no line"
            found.append(metric)
        return f"charts of {' and '.join(found)}"

    def model_version(b: Browser) -> str:
        tags = version.tags
        b.text(f"Version {RETRAINS}", f"version {RETRAINS} header", timeout=FIRST_LOAD_MS)
        model_eps = tags.get(DP_MODEL_EPSILON)
        assert model_eps, f"version {RETRAINS} has no tag dp.model_epsilon"
        run_key, run_eps = _run_epsilon(tags)
        every = [float(_run_epsilon(r.data.tags)[1]) for r in f.runs]
        assert all(float(model_eps) > e for e in every), \
            f"model epsilon {model_eps} is not above every run's own epsilon {every}"
        shown = b.description(f"version {RETRAINS}")
        head = re.match(r"Model guarantee: \(([^,()]+), ([^()]+)\)-DP", shown)
        assert head, f"version description shows {shown[:60]!r}, not 'Model guarantee: (epsilon, delta)-DP'"
        assert _close(head.group(1), model_eps), \
            f"description epsilon {head.group(1)} is not dp.model_epsilon {model_eps}"
        assert _close(head.group(2), tags[DP_DELTA]), \
            f"description delta {head.group(2)} is not dp.delta {tags[DP_DELTA]}"
        model_at = b.page.evaluate(TEXT_AT_JS, head.group(1))
        run_at = b.tag(run_key, run_eps, "run's own epsilon")
        assert model_at is not None, f"model epsilon {head.group(1)} not found in the page"
        assert model_at[0] < run_at[0] and model_at[1] < run_at[1], \
            f"model epsilon {head.group(1)} is not above the run's own {run_key} {run_eps}"
        return f"description {shown[:60]!r}; model epsilon {model_eps} above {run_key} {run_eps}"

    def model(b: Browser) -> str:
        for n in range(RETRAINS, 0, -1):
            b.text(f"Version {n}", f"version {n}", timeout=FIRST_LOAD_MS if n == RETRAINS else THEN_MS, exact=True)
        return f"versions 1-{RETRAINS} listed"

    def deployment(b: Browser) -> str:
        b.text(DEPLOYMENT.split("/")[1], "deployment name", timeout=FIRST_LOAD_MS)
        shown = [fr.name for fr in f.flow_runs[:RETRAINS]]
        for name in shown:
            b.text(name, f"flow run {name}", exact=True)
        completed = b.page.get_by_text("Completed", exact=True).count()
        assert completed >= RETRAINS, f"{completed} Completed flow runs shown, not {RETRAINS}"
        return f"flow runs {', '.join(shown)} Completed"

    def flow_run(b: Browser) -> str:
        last = f.flow_runs[0]
        b.text(last.name, "flow run name", timeout=FIRST_LOAD_MS, exact=True)
        assert last.state_name == "Completed", f"flow run is {last.state_name}"
        b.text("Completed", "state Completed", exact=True)
        b.text("Beginning flow run", "logs")
        expected = f"MLflow run: {run_url}"
        if f.mlflow_log_line is None:
            raise AssertionError("logs have no line 'MLflow run: <url>' (none logged)")
        assert run_url in f.mlflow_log_line, f"log line {f.mlflow_log_line!r} does not name {run_url}"
        link = f'a[href="{run_url}"]'
        row = _scroll_until(b, link, "link to the MLflow run in the logs")
        b.focus = lambda: _scroll_until(b, link, "link to the MLflow run in the logs")  # the log list re-renders
        shown = " ".join(row.locator("xpath=ancestor::div[1]").inner_text().split())
        # Prefect's log view links bare URLs and shows any markdown as typed
        assert shown.startswith(expected), f"log line shows {shown!r}, not {expected!r}"
        return f"{last.name} Completed; logs show {expected}"

    def artifact(b: Browser) -> str:
        if f.artifact_id is None:
            raise AssertionError("the last flow run created no markdown artifact")
        b.element("table", "report", timeout=FIRST_LOAD_MS)
        link = b.element(f'a[href^="{run_url}"]', f"link to the MLflow run {run_url}")
        b.element(f'a[href*="#/models/{RETRAIN}/versions/{RETRAINS}"]', f"link to model version {RETRAINS}")
        accuracy = latest.data.metrics.get("eval/accuracy")
        body = b.page.inner_text("body")
        found = re.search(r"accuracy\D{0,40}?(\d+(?:\.\d+)?)\s*(%?)", body)
        assert found, "accuracy not shown"
        value = float(found.group(1)) / (100 if found.group(2) else 1)
        assert accuracy is not None and abs(value - accuracy) < 0.006, \
            f"accuracy shown {found.group(0)!r}, the run's eval/accuracy is {accuracy}"
        # the model's (epsilon, delta), or the run's own where the report names that
        pairs = re.findall(r"\(([0-9.e+-]+), ([0-9.e+-]+)\)-DP", body)
        model_eps, run_eps = version.tags.get(DP_MODEL_EPSILON, "nan"), _run_epsilon(latest.data.tags)[1]
        delta = latest.data.tags[DP_DELTA]
        model = [p for p in pairs if _close(p[0], model_eps) and _close(p[1], delta)]
        own = [p for p in pairs if _close(p[0], run_eps) and _close(p[1], delta)]
        assert model or own, f"(epsilon, delta) line not shown: pairs {pairs}, model ({model_eps}, {delta})"
        pair = f"model ({', '.join(model[0])})-DP" if model else f"run ({', '.join(own[0])})-DP"
        found = _budget_table(b.page.evaluate(TABLES_JS), f)
        assert found, f"no budget table with a row per run ({RETRAINS}) and a total"
        index, budget = found
        clipped = b.page.evaluate(CLIPPED_JS, index)
        assert not clipped, f"budget table is wider than the page: {clipped[:4]} cut off at its right edge"
        return f"links to {link.get_attribute('href')[-40:]} and version {RETRAINS}; accuracy {value:.4g}; " \
               f"{pair}; budget table of {len(budget)} rows"

    def prefect_login(b: Browser) -> str:
        # Prefect's UI asks for the server's auth string before it shows anything
        field = b.element('input[type="password"]', "the login page's auth string field", timeout=FIRST_LOAD_MS)
        field.fill(f.prefect_auth)
        field.press("Enter")
        b.text("Dashboard", "the dashboard after signing in", timeout=FIRST_LOAD_MS)
        return "signed in with the auth string"

    mlflow_ui, prefect_ui = f.mlflow_ui, f.prefect_ui
    login = [("prefect-login", f"{prefect_ui}/dashboard", prefect_login)] if f.prefect_auth else []
    return [
        ("mlflow-experiment", f"{mlflow_ui}/#/experiments/{f.experiment_id}{EXPERIMENT_VIEW}", experiment),
        ("mlflow-run", run_url, run),
        ("mlflow-run-charts", f"{run_url}/model-metrics", charts),
        ("mlflow-model-version", f"{mlflow_ui}/#/models/{RETRAIN}/versions/{RETRAINS}", model_version),
        ("mlflow-model", f"{mlflow_ui}/#/models/{RETRAIN}", model),
        *login,
        ("prefect-deployment", f"{prefect_ui}/deployments/deployment/{f.deployment_id}", deployment),
        ("prefect-flow-run", f"{prefect_ui}/runs/flow-run/{f.flow_runs[0].id}", flow_run),
        ("prefect-artifact", f"{prefect_ui}/artifacts/artifact/{f.artifact_id}", artifact),
    ]


def _scroll_until(b: Browser, selector: str, what: str):
    """Prefect lists a flow run's logs in a pane that renders more as it scrolls."""
    for _ in range(30):
        found = b.page.locator(selector)
        if found.count() > 0:
            found.first.scroll_into_view_if_needed(timeout=THEN_MS)
            return found.first
        b.page.evaluate("() => document.querySelectorAll('*').forEach(e => { if (e.scrollHeight > e.clientHeight)"
                        " e.scrollTop = e.scrollHeight; })")
        b.page.wait_for_timeout(300)
    raise AssertionError(f"{what} not shown")


def _budget_table(tables: List[List[str]], f: Facts) -> Optional[tuple]:
    """(index, rows) of a table holding a total and a row for each retrain (by MLflow run id, its first 8
    characters, run name, or Prefect flow run name), or None."""
    for index, rows in enumerate(tables):
        if not any(re.search(r"\btotal\b", r, re.I) for r in rows):
            continue
        marks = [{r.info.run_id, r.info.run_id[:8], r.info.run_name} for r in f.runs]
        flow_names = {fr.name for fr in f.flow_runs}
        per_run = [any(any(m and m in row for m in mark) for row in rows) for mark in marks]
        by_flow = sum(any(n in row for n in flow_names) for row in rows)
        if all(per_run) or by_flow >= RETRAINS:
            return index, rows
    return None


def check_pages(facts: Facts, screenshots: Optional[Path], keep_going: bool = False) -> List[str]:
    from playwright.sync_api import sync_playwright

    if screenshots is not None:
        screenshots.mkdir(parents=True, exist_ok=True)
    verified, failed = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), headless=True, args=CHROMIUM_ARGS)
        try:
            if facts.mlflow_user:  # without credentials the MLflow UI shows nothing but the server's refusal
                from playwright.sync_api import Error as PlaywrightError

                stranger = browser.new_context(viewport=VIEWPORT)
                try:  # headless Chromium, which cannot ask for a password, ends the navigation on the 401
                    refused = str(stranger.new_page().goto(facts.mlflow_ui, timeout=FIRST_LOAD_MS).status)
                except PlaywrightError as err:
                    refused = "ERR_INVALID_AUTH_CREDENTIALS" if "ERR_INVALID_AUTH_CREDENTIALS" in str(err) else str(err)
                finally:
                    stranger.close()
                assert refused in ("401", "ERR_INVALID_AUTH_CREDENTIALS"), \
                    f"mlflow-login ({facts.mlflow_ui}): without credentials the UI answered {_one_line(refused)}"
                verified.append(f"mlflow-login: without credentials {refused}; the pages below signed in as "
                                f"{facts.mlflow_user}")
                print(f"ok {verified[-1]}", flush=True)
            credentials = ({"username": facts.mlflow_user, "password": facts.mlflow_password}
                           if facts.mlflow_user else None)
            context = browser.new_context(viewport=VIEWPORT, http_credentials=credentials)
            context.add_init_script(QUIET_MLFLOW)
            b = Browser(context.new_page(), screenshots)
            for name, url, checks in page_checks(facts):
                started = time.monotonic()
                try:
                    summary = b.visit(name, url, checks)
                    line = f"{name} ({time.monotonic() - started:.0f} s): {summary}"
                except AssertionError as err:
                    if not keep_going:
                        raise
                    failed.append(str(err))
                    print(f"FAILED {err}", flush=True)
                    continue
                verified.append(line)
                print(f"ok {line}", flush=True)
        finally:
            browser.close()
    if failed:
        raise AssertionError(f"{len(failed)} of {len(failed) + len(verified)} pages failed: " + " | ".join(failed))
    return verified


def _remove_repo_artifacts(tracking_uri: str, mlruns_existed: bool) -> None:
    """Deployment runs work in the repository (its pull step), so an experiment they create keeps its
    artifacts in ./mlruns there: remove this store's runs and models from it, and the folders they leave
    empty (./mlruns itself only when it did not exist before)."""
    import mlflow

    mlruns = ROOT / "mlruns"
    client = mlflow.MlflowClient(tracking_uri)
    for exp in client.search_experiments():
        location = Path(exp.artifact_location.removeprefix("file://"))
        if not location.is_relative_to(mlruns):
            continue
        paths = [Path(r.info.artifact_uri.removeprefix("file://")).parent
                 for r in client.search_runs([exp.experiment_id])]
        paths += [Path(m.artifact_location.removeprefix("file://")).parent
                  for m in client.search_logged_models(experiment_ids=[exp.experiment_id])]
        for path in paths:
            if path.is_relative_to(location) and path != location:
                shutil.rmtree(path, ignore_errors=True)
        for folder in (location / "models", location):
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty
    if not mlruns_existed:
        with contextlib.suppress(OSError):
            mlruns.rmdir()


# the checkpoint folders deployment runs make in the repository (each run removes its own checkpoints)
CHECKPOINT_FOLDERS = [ROOT / ".privzo" / "checkpoints" / RETRAIN, ROOT / ".privzo" / "checkpoints", ROOT / ".privzo"]


@contextlib.contextmanager
def stack_with_jobs(workdir: Path, quick: bool) -> Iterator[tuple]:
    """The local stack in ``workdir`` after the main job and RETRAINS nightly deployment runs: yields (the
    environment a user would have exported, what ran); stops the stack and removes what the runs left in
    the repository afterwards."""
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    mlruns_existed = (ROOT / "mlruns").exists()
    new_folders = [path for path in CHECKPOINT_FOLDERS if not path.exists()]
    try:
        with local_stack(workdir) as env:
            done = run_jobs(env, workdir, quick)
            for line in done:
                print(f"ok {line}", flush=True)
            yield env, done
    finally:
        try:
            if (workdir / "mlflow.db").exists():
                _remove_repo_artifacts(f"sqlite:///{workdir / 'mlflow.db'}", mlruns_existed)
        except Exception as err:  # a cleanup that fails must not hide what the check found
            print(f"artifacts left in {ROOT / 'mlruns'}: {_one_line(str(err), 200)}", file=sys.stderr)
        for path in new_folders:
            with contextlib.suppress(OSError):
                path.rmdir()  # only when empty


def check(workdir: Path, quick: bool, screenshots: Optional[Path], keep_going: bool = False) -> List[str]:
    """Run the jobs on a local stack in ``workdir`` and check the UIs; returns what was verified."""
    screenshots = Path(screenshots).resolve() if screenshots is not None else None
    problem = browser_problem()
    assert problem is None, problem
    with stack_with_jobs(workdir, quick) as (env, done):
        return done + check_pages(read_facts(env), screenshots, keep_going)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one epoch per run")
    parser.add_argument("--screenshots", type=Path, help="write a PNG of each page here")
    parser.add_argument("--workdir", type=Path, help="keep the stores and specs here (default: a temporary folder)")
    parser.add_argument("--keep-going", action="store_true", help="check every page, then report all failures")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="privzo-ui-")))
        try:
            verified = check(workdir, args.quick, args.screenshots, args.keep_going)
        except (AssertionError, StackInUse) as err:
            print(f"ui check failed: {err}", file=sys.stderr)
            return 1
    print(f"ui check passed: {len(verified)} checks in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
