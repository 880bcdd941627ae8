"""The MLflow UI of a tune: a private search's parent run with its one child (the winner) and a rehearsal's
parent run with a child a setting, nested as MLflow shows a search, in headless Chromium.

    .venv/bin/python infra/tune_screenshot.py [--screenshots docs/screenshots] [--epochs 20]

Runs specs/examples/digits_tune.yaml (its epochs shortened, the candidates one after another) once as the
private search and once as a rehearsal (tune.rows: public) into a scratch MLflow store, serves it with
`mlflow server`, opens the experiment page with both parents expanded and checks that it shows the winner
nested under the search and no losing candidate; the picture is mlflow-tune.png.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import List, Optional

import mlflow
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.ui_check import (BIN, CHROMIUM_ARGS, EXPERIMENT_VIEW, FIRST_LOAD_MS, QUIET_MLFLOW, ROOT, VIEWPORT,  # noqa: E402
                            Browser, free_port, browser_problem, chromium)
from flows.record.tracking_names import TUNE  # noqa: E402


def _spec(workdir: Path, epochs: int, rows: str) -> Path:
    spec = yaml.safe_load((ROOT / "specs" / "examples" / "digits_tune.yaml").read_text())
    spec["optimizer"]["epochs"] = epochs
    spec["execution"] = {"backend": "local"}
    spec["tracking"]["uri"] = f"sqlite:///{workdir / 'mlflow.db'}"
    spec["tune"]["rows"] = rows
    path = workdir / f"digits_tune_{rows}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _served(store: str, port: int, workdir: Path) -> subprocess.Popen:
    server = subprocess.Popen([str(BIN / "mlflow"), "server", "--backend-store-uri", store, "--host", "127.0.0.1",
                               "--port", str(port), "--workers", "1", "--default-artifact-root",
                               str(workdir / "artifacts")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return server
        except OSError:
            time.sleep(1)
    server.kill()
    raise RuntimeError("mlflow server did not answer /health in 120 s")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--screenshots", type=Path, default=ROOT / "docs" / "screenshots")
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args(argv)
    problem = browser_problem()
    if problem:
        print(f"no screenshot: {problem}")
        return 1
    with tempfile.TemporaryDirectory(prefix="privzo-tune-ui-") as scratch:
        workdir = Path(scratch)
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{workdir / 'mlflow.db'}"}
        for rows in ("private", "public"):
            subprocess.run([str(BIN / "privzo"), "tune", str(_spec(workdir, args.epochs, rows))], check=True,
                           cwd=workdir, env=env, stdout=subprocess.DEVNULL)
        store = f"sqlite:///{workdir / 'mlflow.db'}"
        client = mlflow.MlflowClient(store)
        experiment = client.get_experiment_by_name("digits-tune")
        runs = client.search_runs([experiment.experiment_id])
        search = next(r for r in runs if r.data.tags.get(TUNE) == "search")
        winner = next(r for r in runs if r.data.tags.get(TUNE) == "winner")
        assert len([r for r in runs if r.data.tags.get(TUNE) in ("search", "winner")]) == 2, \
            "the private search left more than its parent and its winner"
        port = free_port()
        server = _served(store, port, workdir)
        try:
            from playwright.sync_api import sync_playwright

            args.screenshots.mkdir(parents=True, exist_ok=True)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium(), headless=True, args=CHROMIUM_ARGS)
                context = browser.new_context(viewport=VIEWPORT)
                context.add_init_script(QUIET_MLFLOW)
                b = Browser(context.new_page(), args.screenshots)

                def shows_both_searches(b: Browser) -> str:
                    b.text(search.info.run_name, "the search's parent run", timeout=FIRST_LOAD_MS)
                    # MLflow folds a parent's children under it: its run name cell's button unfolds them
                    unfold = 'button[data-component-id$="runnamecellrenderer.tsx_46"]'
                    for name in (search.info.run_name, f"{experiment.name}-rehearsal"):
                        row = b.page.locator(".ag-row", has_text=name).first
                        row.locator(unfold).first.click()
                        b.page.wait_for_timeout(1000)
                    b.text(winner.info.run_name, "the winner's child run")
                    b.text("optimizer.lr=0.2, mechanism.clip=0.5", "a rehearsal setting's child run")
                    return f"{search.info.run_name} > {winner.info.run_name}; the rehearsal's 12 settings"

                print(b.visit("mlflow-tune", f"http://127.0.0.1:{port}/#/experiments/{experiment.experiment_id}"
                              f"{EXPERIMENT_VIEW}", shows_both_searches))
                browser.close()
        finally:
            server.terminate()
            server.wait(timeout=30)
    print(f"screenshot: {args.screenshots / 'mlflow-tune.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
