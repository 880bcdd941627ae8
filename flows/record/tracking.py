"""MLflow conventions (docs/design.md, "MLflow conventions"): params = flattened resolved spec, dp.* tags, per-step metrics."""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

import mlflow
from mlflow.exceptions import MlflowException

from flows.record.reporting import PrivacySummary, shown
from flows.record.tracking_names import (
    MLFLOW_EXPERIMENT_KIND, MLFLOW_GIT_COMMIT, MLFLOW_RUN_NOTE, MLFLOW_SOURCE_NAME, MLFLOW_SOURCE_TYPE,
    DATA_FINGERPRINT, DP_ACCOUNTANT, DP_DELTA, DP_EPSILON, DP_GUARANTEE, DP_LARGE_DELTA, DP_NEIGHBORING,
    DP_NOISE_MULTIPLIER, DP_NOISE_SOURCE, DP_PRIVATE, DP_STEPS, DP_ZCDP_RHO)


KEY_ENV = "PRIVZO_FINGERPRINT_KEY"


def _fingerprint_key() -> bytes:
    """``$PRIVZO_FINGERPRINT_KEY``, else this user's key in ~/.privzo/fingerprint.key (created on first use,
    readable by its owner only). Machines that should agree on fingerprints share the variable."""
    value = os.environ.get(KEY_ENV)
    if value:
        return value.encode()
    path = Path.home() / ".privzo" / "fingerprint.key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # written whole under a temporary name, then linked into place: a reader never sees a file still
        # being written (an empty key would make every keyed fingerprint computable by anyone)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".fingerprint.key.")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
                f.flush()
                os.fsync(f.fileno())
            os.link(tmp, path)
        except FileExistsError:  # created by a concurrent run: use theirs
            pass
        finally:
            os.unlink(tmp)
    key = path.read_text().strip()
    if len(key) < 32:
        raise ValueError(f"fingerprint key {path} holds {len(key)} characters, fewer than 32: it is damaged. Restore it, "
                         f"or set {KEY_ENV}; a new key cannot match rows the ledger recorded under the old one")
    return key.encode()


def released_fingerprint(private_fingerprint: str) -> str:
    """The ``data.fingerprint`` tag: HMAC-SHA256 of the private rows' content fingerprint under a secret
    key. A plain hash of the private rows is a function of them released without noise: whoever knows
    every row but one could test whether that one was trained on. Keyed, only the key's holders can link
    runs to data (the same rows give the same tag under the same key)."""
    return hmac.new(_fingerprint_key(), bytes.fromhex(private_fingerprint), hashlib.sha256).hexdigest()


# The ledger's row layout records that its row fingerprints are keyed: a ledger written with plain
# hashes (before they were keyed) does not match them, and its next run is refused in one line
KEYED_ROWS = "rows=hmac-sha256"


def keyed_rows(row_fingerprints: Sequence[str]) -> List[str]:
    """Each row's content fingerprint as the ledger stores it: HMAC-SHA256 under the fingerprint key.
    A plain hash of a row is private data released without noise: whoever reads the ledger and knows a
    person's features could hash them with each label and learn whether, and with which label, that person
    was trained on. Keyed, rows match across runs that share the key and are unlinkable without it."""
    base = hmac.new(_fingerprint_key(), digestmod=hashlib.sha256)
    out = []
    for fingerprint in row_fingerprints:
        h = base.copy()
        h.update(bytes.fromhex(fingerprint))
        out.append(h.hexdigest())
    return out


def dp_tags(summary: PrivacySummary, data_fingerprint: str) -> Dict[str, str]:
    """``data_fingerprint``: the private rows' content fingerprint; the tag carries its keyed form."""
    rho = {DP_ZCDP_RHO: shown(summary.rho, 6)} if summary.rho is not None else {}
    return {
        **rho,
        DP_EPSILON: shown(summary.epsilon, 6),
        DP_DELTA: shown(summary.delta, 6),
        DP_ACCOUNTANT: summary.accountant,
        DP_NEIGHBORING: summary.neighboring,
        DP_GUARANTEE: summary.guarantee(),
        DP_NOISE_MULTIPLIER: f"{summary.noise_multiplier:.6g}",
        DP_STEPS: str(summary.steps),
        DP_PRIVATE: "true" if summary.private else "false",
        DP_NOISE_SOURCE: summary.noise_source if summary.mechanism != "none" else "none",
        DATA_FINGERPRINT: released_fingerprint(data_fingerprint),
        **({DP_LARGE_DELTA: "true"} if summary.large_delta_rows is not None else {}),
    }


def log_text_artifacts(client: mlflow.MlflowClient, run_id: str, files: Dict[str, str]) -> None:
    """Write each ``relative/name -> text`` into the run's artifact root (no active run needed)."""
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in files.items():
            path = Path(tmp, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            parent = str(Path(name).parent)
            client.log_artifact(run_id, str(path), artifact_path=None if parent == "." else parent)


def journal_json(entries: Iterable) -> str:
    return json.dumps([{"step": e.step, "seed": e.seed, "coefficient": e.coefficient} for e in entries])


# What kind of work an experiment holds. MLflow 3.17's UI opens an experiment in the view of the browser's
# workflow switch (GenAI, where privzo's runs are not shown, unless the person chose "Model training") and
# reads this tag only where that switch is off; a link opens the training view by naming it (EXPERIMENT_VIEW)
TRAINING_KIND = "custom_model_development"
DESCRIPTION = MLFLOW_RUN_NOTE
EXPERIMENT_KIND = MLFLOW_EXPERIMENT_KIND


def training_experiment(client: mlflow.MlflowClient, name: str) -> str:
    """The id of experiment ``name`` (created if new), tagged as model training unless someone chose its
    kind already."""
    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            experiment_id = client.create_experiment(name)
        except MlflowException:  # created by a concurrent run
            exp = client.get_experiment_by_name(name)
            experiment_id = exp.experiment_id
    else:
        experiment_id = exp.experiment_id
    if exp is None or EXPERIMENT_KIND not in exp.tags:
        client.set_experiment_tag(experiment_id, EXPERIMENT_KIND, TRAINING_KIND)
    return experiment_id


def run_name(name: str) -> str:
    """The UTC start time, then ``name``: runs of one spec told apart in MLflow's runs list, whose name
    column shows a name's first 23 characters."""
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} {name}"


def tool(name: str) -> str:
    """A privzo, prefect or mlflow command that works pasted into a fresh shell: the one beside this
    interpreter, by its path unless the shell already finds that very one."""
    mine = Path(sys.executable).parent / name
    found = shutil.which(name)
    if found and mine.exists() and os.path.samefile(found, mine):
        return name
    return str(mine)


UI_ENV, UI_STORE_ENV = "PRIVZO_MLFLOW_UI_URL", "PRIVZO_MLFLOW_UI_STORE"


def _store(uri: str) -> str:
    if uri.startswith("sqlite:///"):  # relative to the working folder, as MLflow reads it
        return "sqlite:///" + os.path.abspath(uri[len("sqlite:///"):])
    return uri


def ui_base(tracking_uri: str) -> Optional[str]:
    """Where a person browses ``tracking_uri``'s runs: the tracking server itself, or the UI the local
    stack serves ($PRIVZO_MLFLOW_UI_URL) when it serves this very store ($PRIVZO_MLFLOW_UI_STORE); None
    when no UI is known."""
    if tracking_uri.split("://", 1)[0].lower() in ("http", "https"):
        return tracking_uri.rstrip("/")
    ui, store = os.environ.get(UI_ENV), os.environ.get(UI_STORE_ENV)
    if ui and store and _store(store) == _store(tracking_uri):
        return ui.rstrip("/")
    return None


def run_url(tracking_uri: str, experiment_id: str, run_id: str) -> Optional[str]:
    base = ui_base(tracking_uri)
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}" if base else None


EXPERIMENT_VIEW = "?workflowType=machine_learning"


def experiment_url(tracking_uri: str, experiment_id: str) -> Optional[str]:
    """The experiment's runs list (MLflow's training view, whatever the browser's switch says)."""
    base = ui_base(tracking_uri)
    return f"{base}/#/experiments/{experiment_id}{EXPERIMENT_VIEW}" if base else None


def version_url(tracking_uri: str, name: str, version: str) -> Optional[str]:
    base = ui_base(tracking_uri)
    return f"{base}/#/models/{name}/versions/{version}" if base else None


def ui_command(tracking_uri: str) -> str:
    return f"{tool('mlflow')} ui --backend-store-uri {tracking_uri}"


ROOT_OF_PRIVZO = Path(__file__).resolve().parents[2]  # the checkout (or installed tree) of flows/


def code_version() -> Dict[str, str]:
    """MLflow's own source tags for a run of privzo: what ran (the flow's module) and, from a git checkout, the
    commit its HEAD names. Read from the checkout's own files, never by running git (a worker may have none)."""
    tags = {MLFLOW_SOURCE_NAME: "privzo (flows/private_train.py)", MLFLOW_SOURCE_TYPE: "JOB"}
    commit = _git_head(ROOT_OF_PRIVZO / ".git")
    if commit:
        tags[MLFLOW_GIT_COMMIT] = commit
    return tags


def _git_head(git: Path) -> Optional[str]:
    """The commit a checkout's HEAD names (a branch's ref, loose or packed, or a detached head), else None."""
    try:
        if git.is_file():  # a worktree: "gitdir: PATH"
            git = Path(git.read_text().split(":", 1)[1].strip())
        head = (git / "HEAD").read_text().strip()
    except OSError:
        return None
    if not head.startswith("ref: "):
        return head or None
    ref = head[5:]
    for base in (git, _common_dir(git)):
        loose = base / ref
        if loose.is_file():
            return loose.read_text().strip()
        packed = base / "packed-refs"
        if packed.is_file():
            for line in packed.read_text().splitlines():
                if line.endswith(" " + ref):
                    return line.split(" ", 1)[0]
    return None


def _common_dir(git: Path) -> Path:
    common = git / "commondir"
    return (git / common.read_text().strip()).resolve() if common.is_file() else git


def dataset_input(spec, data_fingerprint: str):
    """The run's data as an MLflow dataset input (the UI's Datasets): where it is read from (a password never
    shown), its schema (the features, the label) and a digest, the keyed fingerprint the run already releases
    (``data_fingerprint``); no row, and no count."""
    from mlflow.data.code_dataset_source import CodeDatasetSource
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.types import ColSpec, DataType, Schema
    from mlflow.types.schema import Array

    from specs.run import without_passwords

    source = spec.data.source
    described = {k: str(v) for k, v in without_passwords(source.model_dump(mode="json")).items()
                 if v is not None and k in ("kind", "name", "path", "url", "table", "query", "label", "row_id")}
    # a row's features (the model's inputs, as many as its width) and its class
    schema = Schema([ColSpec(Array(DataType.float), "features"), ColSpec(DataType.long, "label")])
    return MetaDataset(CodeDatasetSource(tags=described), name=f"{source.kind}:{getattr(source, 'name', None) or spec.name}",
                       digest=data_fingerprint[:16], schema=schema)
