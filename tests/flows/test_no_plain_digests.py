"""No unkeyed digest of private rows is stored or shown anywhere (docs/design.md, "Privacy invariants" 7).

A plain hash of the private rows (one row's content fingerprint, or the set's) lets anyone who knows
every row but one test membership. After a private run with a budget and a kept checkpoint, every
place the run wrote is searched for every plain row and set digest of its data: the checkpoint, the
printed logs and Prefect's stored logs, MLflow params, tags, artifacts and the registered version's
tags, Prefect artifacts, and every value of every ledger table.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path

import mlflow
import pytest
import torch

from flows.record.tracking_names import PRIVACY_REPORT_ARTIFACT

pytestmark = pytest.mark.e2e


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, bytes):
        yield value.decode("latin-1")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, (list, tuple, set)):
        for v in value:
            yield from _strings(v)


def test_no_plain_row_or_set_digest_reaches_any_output(prefect_server, tiny_spec_dict, tmp_path, mlflow_db, monkeypatch,
                                                       capfd):
    import specs
    from components import builders
    from flows.private_train import private_train

    monkeypatch.chdir(tmp_path)
    ledger = tmp_path / "ledger.db"
    tiny_spec_dict["optimizer"]["steps"] = 20
    tiny_spec_dict["tracking"]["uri"] = mlflow_db
    tiny_spec_dict["checkpoint"] = {"dir": str(tmp_path / "checkpoints"), "keep": True}
    tiny_spec_dict["budget"] = {"dataset": "digits-people", "lifetime_epsilon": 4.0, "ledger": f"sqlite:///{ledger}"}
    result = private_train(spec=tiny_spec_dict)

    data = builders.load_data(specs.spec_from_dict(tiny_spec_dict))
    plain = {t.fingerprint for t in (data.private, data.public, data.test)} | {data.ordered_digest}
    plain |= {f for t in (data.private, data.public, data.test) for f in t.fingerprints}
    assert all(len(d) == 64 for d in plain) and len(plain) > 1000

    found = {}  # where -> text

    def look(where: str, text: str) -> None:
        found[where] = found.get(where, "") + "\n" + text

    for path in Path(tiny_spec_dict["checkpoint"]["dir"]).rglob("*"):
        if path.is_file():
            look(str(path), path.read_bytes().decode("latin-1"))
            if path.suffix == ".pt":
                look(f"{path} (loaded)", "\n".join(_strings(torch.load(path, weights_only=True))))
    assert any("checkpoint" in w for w in found), "the kept checkpoint was not found"
    out, err = capfd.readouterr()
    look("printed logs", out + err)

    client = mlflow.MlflowClient(tiny_spec_dict["tracking"]["uri"])
    run = client.get_run(result["run_id"])
    look("mlflow params", "\n".join(_strings(run.data.params)))
    look("mlflow tags", "\n".join(_strings(run.data.tags)))
    version = client.get_model_version(tiny_spec_dict["name"], result["model_version"])
    look("registered version tags", "\n".join(_strings(version.tags)))
    artifacts = Path(client.download_artifacts(run.info.run_id, "", str(tmp_path / "artifacts")))
    files = [p for p in artifacts.rglob("*") if p.is_file()]
    assert any(p.name == PRIVACY_REPORT_ARTIFACT for p in files)
    for path in files:
        look(f"mlflow artifact {path.name}", path.read_bytes().decode("latin-1"))

    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as prefect:
        look("prefect artifacts", "\n".join(str(a.data) for a in prefect.read_artifacts()))
        look("prefect logs", "\n".join(log.message for log in prefect.read_logs()))
    assert "privacy-report" in found["prefect artifacts"] or "Privacy report" in found["prefect artifacts"]

    with sqlite3.connect(ledger) as db:
        tables = [r[0] for r in db.execute("select name from sqlite_master where type = 'table'")]
        for table in tables:
            look(f"ledger table {table}", "\n".join(_strings(db.execute(f"select * from {table}").fetchall())))
    assert any(w.startswith("ledger table") and len(t) > 1000 for w, t in found.items())

    leaks = {where: sorted(d[:12] for d in plain if d in text) for where, text in found.items()}
    assert not {w: d for w, d in leaks.items() if d}, leaks
