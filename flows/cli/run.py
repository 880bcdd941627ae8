"""``privzo run SPEC``: one private training run as a Prefect flow, tracked in MLflow and charged to its
ledger; checked as calibrate checks it before Prefect starts."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import specs
from flows.cli.common import installed_spec, say_over_declared, summary_line


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="run a spec as a Prefect flow, tracked in MLflow")
    p.add_argument("spec")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--resume", metavar="KEY", default=None,
                   help="resume a killed run from its last checkpoint: its run key (printed at start) or 'latest'")
    p.add_argument("--as-of", metavar="TIME", default=None,
                   help="with data.blocks: the night whose window the run reads (ISO 8601, e.g. "
                   "2026-09-08T02:00:00+00:00; default now), as a deployment's scheduled time gives it")
    p.set_defaults(func=command)


def _preflight(spec: specs.RunSpec, resume: Optional[str]) -> None:
    """What ``calibrate`` checks, plus the model's shape and size and the checkpoint to resume, before
    Prefect starts: a spec that does not fit its data fails in one line, not after Prefect's task
    tracebacks. Costs one extra load of the data."""
    from components import builders
    from flows.checkpoints import resume_store

    data = builders.load_data(spec, every_block=True)
    builders.plan(spec, data)
    say_over_declared(spec)
    builders.check_model(spec, data.n_features, data.n_classes,
                         os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    from components import memory_plan
    memory_plan.check_data(spec, data)  # the plan's peak against the device's memory
    resume_store(spec.checkpoint.dir, spec.name, resume)


def command(args) -> int:
    spec = installed_spec(args.spec)  # fail fast, before Prefect or MLflow start
    if spec.tune is not None:  # as the private-train flow refuses it, before Prefect starts
        raise specs.SpecError("tune: this spec searches its hyperparameters; run it with privzo tune (the "
                              "private-tune flow), or remove its tune section to train it as written")
    # Prefect configures logging on import: before anything else logs (dp-accounting's absl would install
    # a plain root handler, and every Prefect line would print twice over in two formats)
    from flows.private_train import private_train
    from flows.record.tracking import EXPERIMENT_VIEW, run_url, ui_command

    _preflight(spec, args.resume)
    result = private_train(spec_path=str(args.spec), progress=not args.no_progress, resume=args.resume,
                           as_of=args.as_of)
    print()
    if result["before"]:  # a language model's zero-shot score through its prompt; any other's at its start
        start = "zero-shot" if getattr(spec.model, "prompt", None) is not None else "before training"
        print(summary_line(f"{spec.name} {start}", result["before"]))
    print(summary_line(spec.name, result))
    if spec.privacy is None:
        print(f"privacy: {result['guarantee']}")
    else:
        if result["model_guarantee"] != result["guarantee"]:
            print(f"model {spec.name} version {result['model_version']}: {result['model_guarantee']}")
        print(f"{'this run spent' if result['model_guarantee'] != result['guarantee'] else 'privacy'}: "
              f"{result['guarantee']}  (target epsilon {result['target_epsilon']}, "
              f"sigma {result['noise_multiplier']:.4g}, {result['steps']} steps)")
    uri = result["tracking_uri"]
    if result.get("model_version"):  # what a consumer loads: the version by number (or @verified once promoted)
        model = f"models:/{spec.name}/{result['model_version']}"
        print(f"load it: mlflow.pyfunc.load_model('{model}') with MLFLOW_TRACKING_URI={uri}")
        # mlflow's server is uvicorn, found on PATH: the venv's bin first
        print(f"serve it: PATH={Path(sys.executable).parent}:$PATH MLFLOW_TRACKING_URI={uri} mlflow models serve "
              f"-m {model} --env-manager local -h 127.0.0.1 -p 5001  (POST rows to http://127.0.0.1:5001/invocations)")
    link = run_url(uri, result["experiment_id"], result["run_id"])
    if link:
        print(f"MLflow run {result['run_name']}: {link}")
    else:
        print(f"MLflow run {result['run_name']} ({result['run_id']}) in {uri}")
        print(f"open the UI with: {ui_command(uri)}  (then http://127.0.0.1:5000/#/experiments/"
              f"{result['experiment_id']}{EXPERIMENT_VIEW})")
    return 0
