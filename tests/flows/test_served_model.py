"""What a consumer loads: a registered version takes the rows as the source stores them (named columns, their
stored types, raw values), applies the run's own preprocessing, and answers in the spec's class names with
probabilities; it loads in a fresh process that imports nothing of privzo's, refuses bytes other than those
logged, and serves as MLflow serves models (flows/record/served.py, flows/record/served_model.py)."""
import copy
import json
import os
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest

pytestmark = pytest.mark.e2e
BIN = Path(sys.executable).parent
SQL_NAME, TEXT_NAME = "tiny-visits", "tiny-tickets"


def _digits_table(path: Path) -> str:
    """Digits as a team would store them: an integer id, 64 INTEGER pixel columns, the label."""
    from sklearn.datasets import load_digits

    frame = load_digits(as_frame=True).frame.astype({c: "int64" for c in load_digits().feature_names})
    frame.insert(0, "visit", np.arange(len(frame)))
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE visits (visit INTEGER PRIMARY KEY, "
                    + ", ".join(f"{c} INTEGER" for c in frame.columns[1:]) + ")")
        con.executemany(f"INSERT INTO visits VALUES ({', '.join('?' * frame.shape[1])})",
                        frame.astype(object).itertuples(index=False, name=None))
    return f"sqlite:///{path}"


@pytest.fixture(scope="module")
def registered(prefect_server, mlflow_schema, tmp_path_factory):
    """Two versions in one store: the tiny digits spec (fixed scale 1/16) and the same rows from a SQL table of
    integer columns (public standardisation), each with the test rows as stored and the run's test accuracy."""
    from components import builders
    from components.data.sources import load_sklearn
    from flows.private_train import private_train
    from tests.conftest import TINY, copy_mlflow_store

    tmp = tmp_path_factory.mktemp("served")
    uri = copy_mlflow_store(mlflow_schema, tmp / "mlflow.db")
    digits = copy.deepcopy(TINY)
    digits["tracking"]["uri"] = uri
    table_url = _digits_table(tmp / "rows.db")
    visits = copy.deepcopy(digits)
    visits["name"] = SQL_NAME
    visits["data"]["source"] = {"kind": "sql", "url": table_url, "table": "visits", "label": "target",
                                "row_id": "visit", "classes": list(range(10))}
    visits["data"]["split"] = {"kind": "hashed", "public": 0.1, "test": 0.2}
    # a text classifier: a file's text column, read by MiniLM's tokenizer inside the served model
    tickets = pd.DataFrame({"ticket": np.arange(240), "queue": ["billing" if i % 2 else "login" for i in range(240)],
                            "body": [f"ticket {i} about my {'invoice' if i % 2 else 'password'}" for i in range(240)]})
    tickets.to_csv(tmp / "tickets.csv", index=False)
    text = copy.deepcopy(digits)
    text.update(name=TEXT_NAME, model={"kind": "hf", "name": "minilm", "trainable": "bias"},
                estimator={"kind": "two_point", "queries": 1, "smoothing": 1e-3},
                optimizer={"kind": "sgd", "lr": 1e-3, "steps": 3})
    text["sampling"]["expected_batch_size"] = 16
    text["data"] = {"declared_private_rows": 180, "split": {"kind": "hashed", "public": 0.1, "test": 0.2},
                    "source": {"kind": "file", "path": str(tmp / "tickets.csv"), "label": "queue", "row_id": "ticket",
                               "classes": ["login", "billing"], "text": "body", "max_length": 12}}
    cwd = os.getcwd()
    os.chdir(tmp)
    try:
        results = {"digits": private_train(spec=digits), "visits": private_train(spec=visits),
                   "tickets": private_train(spec=text)}
    finally:
        os.chdir(cwd)
    # the test rows as stored: digits' raw pixels (float64, as scikit-learn gives them), the table's rows as read
    import specs

    raw = load_sklearn("digits")
    where = {fp: i for i, fp in enumerate(raw.row_fingerprints())}
    test = builders.load_data(specs.spec_from_dict(digits)).test
    digits_rows = pd.DataFrame(raw.features[[where[fp] for fp in test.fingerprints]].astype(np.float64),
                               columns=raw.served_columns)
    visits_data = builders.load_data(specs.spec_from_dict(visits))
    stored = pd.read_sql("SELECT * FROM visits", f"sqlite:///{tmp / 'rows.db'}").set_index("visit", drop=False)
    from components.data.sql import load_sql

    table = load_sql(specs.spec_from_dict(visits).data.source)
    ids = dict(zip(table.row_fingerprints(), table.row_ids))
    visits_rows = stored.loc[[int(ids[fp]) for fp in visits_data.test.fingerprints]]
    text_spec = specs.spec_from_dict(text)
    text_table, text_test = builders.source_table(text_spec), builders.load_data(text_spec).test
    ids = dict(zip(text_table.row_fingerprints(), text_table.row_ids))
    text_rows = tickets.set_index("ticket", drop=False).loc[[int(ids[fp]) for fp in text_test.fingerprints]]
    rows = {"digits": (digits_rows, test.labels), "visits": (visits_rows, visits_data.test.labels),
            "tickets": (text_rows[["body"]], text_test.labels)}
    return uri, results, rows, visits_data, tmp, visits


def _consumer(script: str, uri: str, cwd: Path) -> str:
    """``script`` in a fresh interpreter (-I: no privzo on its path) that refuses any import of privzo's packages."""
    guard = textwrap.dedent("""
        import sys
        class _NoPrivzo:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("flows", "components", "specs", "reproduce"):
                    raise ImportError(f"privzo's {name} imported by a consumer's load")
        sys.meta_path.insert(0, _NoPrivzo())
    """)
    out = subprocess.run([sys.executable, "-I", "-c", guard + textwrap.dedent(script)], cwd=cwd, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "MLFLOW_TRACKING_URI": uri})
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_a_fresh_process_with_mlflow_and_torch_only_predicts_the_runs_accuracy_from_stored_rows(registered):
    uri, results, rows, _, tmp, _ = registered
    for key, name in (("digits", "tiny-digits"), ("visits", SQL_NAME)):
        frame, labels = rows[key]
        frame.to_csv(tmp / f"{key}.csv", index=False)
        answer = json.loads(_consumer(f"""
            import json, numpy as np, pandas as pd, mlflow
            model = mlflow.pyfunc.load_model("models:/{name}/{results[key]['model_version']}")
            frame = pd.read_csv("{key}.csv")
            names = model.metadata.get_input_schema().input_names()
            out = model.predict(frame)
            # an array of the rows (float64 for scikit-learn's, int64 for the table's), named by the signature
            as_array = model.predict(pd.DataFrame(frame[names].to_numpy(), columns=names))
            try:
                model.predict(frame[names].to_numpy())
                bare = "accepted"
            except Exception as err:
                bare = str(err).splitlines()[-1]
            print(json.dumps({{"labels": out["label"].tolist(), "columns": list(out.columns), "names": names,
                              "types": [s.type.name for s in model.metadata.get_input_schema().inputs],
                              "same": bool(out.equals(as_array)), "bare": bare,
                              "sums": out.filter(like="probability_").sum(axis=1).tolist()}}))
        """, uri, tmp))
        accuracy = float(np.mean(np.asarray(answer["labels"]).astype(int) == labels))
        assert accuracy == pytest.approx(results[key]["eval/accuracy"], abs=1e-12), (key, accuracy)
        assert answer["columns"] == ["label"] + [f"probability_{c}" for c in range(10)]
        assert np.allclose(answer["sums"], 1.0) and answer["same"]
        assert answer["names"][:2] == ["pixel_0_0", "pixel_0_1"] and len(answer["names"]) == 64
        # the stored types: scikit-learn's floats; the table's INTEGER columns
        assert set(answer["types"]) == {"double" if key == "digits" else "long"}
        # MLflow enforces a named column schema: a bare array has no names to match (any MLflow model's signature)
        assert "missing inputs" in answer["bare"]


def test_a_text_classifier_takes_its_text_column_and_answers_its_class_names(registered):
    """The file's text column in (MiniLM's tokenizer inside, so a load needs transformers beside mlflow and
    torch, and nothing of privzo's); the queue's names out, scoring the run's test accuracy."""
    uri, results, rows, _, tmp, _ = registered
    frame, labels = rows["tickets"]
    frame.to_csv(tmp / "tickets-test.csv", index=False)
    answer = json.loads(_consumer(f"""
        import json, pandas as pd, mlflow
        model = mlflow.pyfunc.load_model("models:/{TEXT_NAME}/{results['tickets']['model_version']}")
        out = model.predict(pd.read_csv("tickets-test.csv"))
        schema = model.metadata.get_input_schema()
        print(json.dumps({{"labels": out["label"].tolist(), "columns": list(out.columns),
                          "inputs": [(s.name, s.type.name) for s in schema.inputs]}}))
    """, uri, tmp))
    assert answer["inputs"] == [["body", "string"]]
    assert answer["columns"] == ["label", "probability_login", "probability_billing"]
    accuracy = float(np.mean(np.asarray([["login", "billing"].index(v) for v in answer["labels"]]) == labels))
    assert accuracy == pytest.approx(results["tickets"]["eval/accuracy"], abs=1e-12)


def test_the_preprocessing_in_the_model_is_the_public_rows_and_declared_constants_only(registered, tmp_path):
    uri, results, _, visits_data, _, _ = registered
    client = mlflow.MlflowClient(uri)
    prep = {}
    for name, version in (("tiny-digits", results["digits"]["model_version"]),
                          (SQL_NAME, results["visits"]["model_version"])):
        local = Path(mlflow.artifacts.download_artifacts(client.get_model_version_download_uri(name, version),
                                                         dst_path=str(tmp_path / name), tracking_uri=uri))
        prep[name] = json.loads((local / "artifacts" / "preprocessing.json").read_text())
    assert prep["tiny-digits"]["kind"] == "fixed" and prep["tiny-digits"]["scale"] == pytest.approx(1 / 16)
    assert prep["tiny-digits"]["mean"] is None
    visits = prep[SQL_NAME]
    assert visits["kind"] == "public" and visits["classes"] == [str(c) for c in range(10)]
    # exactly what the split applied: its public rows' statistics, nothing computed from a private row
    assert visits_data.preprocessing.mean == tuple(visits["mean"]) and visits_data.preprocessing.std == tuple(visits["std"])
    import specs
    from components.data.sql import load_sql

    table = load_sql(specs.spec_from_dict(registered[5]).data.source)
    where = {fp: i for i, fp in enumerate(table.row_fingerprints())}
    public = table.features[[where[fp] for fp in visits_data.public.fingerprints]]
    assert np.array_equal(public.mean(axis=0), np.asarray(visits["mean"], dtype=np.float32))
    everything = table.features.mean(axis=0)  # what a private statistic would have been
    assert not np.array_equal(everything, np.asarray(visits["mean"], dtype=np.float32))


def test_a_version_whose_artifact_was_changed_is_refused_at_load_in_one_line(registered, tmp_path):
    uri, results, _, _, _, _ = registered
    client = mlflow.MlflowClient(uri)
    local = Path(mlflow.artifacts.download_artifacts(
        client.get_model_version_download_uri("tiny-digits", results["digits"]["model_version"]),
        dst_path=str(tmp_path), tracking_uri=uri))
    prep = local / "artifacts" / "preprocessing.json"
    prep.write_text(prep.read_text().replace('"fixed"', '"none"'))
    with pytest.raises(Exception) as caught:
        mlflow.pyfunc.load_model(str(local))
    message = str(caught.value)
    assert "preprocessing.json is not the bytes it was logged with" in message and "not loaded" in message


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_mlflow_models_serve_answers_labels_and_probabilities(registered):
    uri, results, rows, _, tmp, _ = registered
    frame = rows["visits"][0].head(3)
    port = _free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    server = subprocess.Popen([str(BIN / "mlflow"), "models", "serve", "-m",
                               f"models:/{SQL_NAME}/{results['visits']['model_version']}", "--env-manager", "local",
                               "-h", "127.0.0.1", "-p", str(port)], cwd=tmp, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2)
                break
            except OSError:
                assert server.poll() is None, server.stderr.read()[-2000:]
                assert time.monotonic() < deadline, "mlflow models serve did not answer /ping in 180 s"
                time.sleep(0.5)

        def post(body: bytes, content_type: str) -> list:
            request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=body,
                                             headers={"Content-Type": content_type})
            with urllib.request.urlopen(request, timeout=60) as answer:
                return json.loads(answer.read())["predictions"]

        split = post(json.dumps({"dataframe_split": json.loads(frame.to_json(orient="split", index=False))}).encode(),
                     "application/json")
        records = post(json.dumps({"dataframe_records": frame.to_dict(orient="records")}).encode(), "application/json")
        csv = post(frame.to_csv(index=False).encode(), "text/csv")
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert split == records == csv and len(split) == 3
    assert set(split[0]) == {"label"} | {f"probability_{c}" for c in range(10)}
    assert all(r["label"] in {str(c) for c in range(10)} and abs(sum(v for k, v in r.items() if k != "label") - 1) < 1e-9
               for r in split)
