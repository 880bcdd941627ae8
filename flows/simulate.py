"""The growing-data example, and nights of it played ahead of time.

``write_stream`` makes the example's stream: scikit-learn's digits (shipped in its wheel) arriving
``per_day`` rows a day from ``start``, in a fixed public order, each row with its arrival date and a
patient (every patient comes back once, three days after their first visit). The file as of a moment holds
every row arrived by then, the day in progress included, as a team's export would.

``grow_stream`` is that export as a Prefect flow (deployment digits-stream-grow in infra/prefect.yaml, an
hour before the nightly retrain digits-stream-nightly). ``simulate`` plays N nights of a spec on blocks on
a scratch ledger and MLflow store: each night the file grows (or, for a spec reading a table, the night's rows
are inserted into a SQLite table: ``insert_stream``) and the private-train flow runs as of 02:00 UTC that night.
"""
from __future__ import annotations

import copy
import datetime as dt
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
from prefect import flow

import specs

STREAM_START = dt.date(2026, 9, 1)
PER_DAY = 25
RETURN_AFTER = 3  # days between a patient's two visits


def stream_frame(as_of: dt.datetime, start: dt.date = STREAM_START, per_day: int = PER_DAY, with_visits: bool = False):
    """The example stream's rows arrived by ``as_of`` (UTC): digits in a fixed order (seed 0, public), row i
    arriving on day i // per_day; patient k's first visit is row 2k, their second row 2k+1 arrives
    RETURN_AFTER days later. ``with_visits``: a first column ``visit``, row i's number i (a table's key)."""
    import pandas as pd

    from components.data import load_sklearn

    table = load_sklearn("digits")
    order = np.random.default_rng(0).permutation(len(table))
    frame = pd.DataFrame(table.features[order], columns=[f"px{i}" for i in range(64)])
    frame["digit"] = table.labels[order]
    index = np.arange(len(frame))
    day = index // per_day + np.where(index % 2 == 1, RETURN_AFTER, 0)
    frame["arrived"] = [(start + dt.timedelta(days=int(d))).isoformat() for d in day]
    frame["patient"] = [f"patient-{k:05d}" for k in index // 2]
    if with_visits:
        frame.insert(0, "visit", index)
    arrived = as_of.astimezone(dt.timezone.utc).date()
    return frame[[dt.date.fromisoformat(a) <= arrived for a in frame["arrived"]]].reset_index(drop=True)


def write_stream(path: Path, as_of: dt.datetime, **kwargs) -> int:
    """The stream as of ``as_of`` written to ``path`` (CSV, replaced whole); returns its row count."""
    frame = stream_frame(as_of, **kwargs)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".part")
    frame.to_csv(tmp, index=False)
    os.replace(tmp, path)  # a run reading the file meanwhile sees the old one or the new one, whole
    return len(frame)


def insert_stream(url: str, table: str, as_of: dt.datetime, start: dt.date = STREAM_START) -> int:
    """The example stream as a database table (data.source.kind sql), as a team's ETL keeps one: the rows
    arrived by ``as_of`` that are not in it yet are inserted (the table is made on the first call), each row
    named by its ``visit`` number (its position in the stream: the primary key). Returns the rows inserted."""
    import sqlalchemy as sa

    frame = stream_frame(as_of, start=start, with_visits=True)
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            rows = sa.Table(table, sa.MetaData(), sa.Column("visit", sa.BigInteger, primary_key=True, autoincrement=False),
                            *[sa.Column(f"px{i}", sa.Float, nullable=False) for i in range(64)],
                            sa.Column("digit", sa.Integer, nullable=False), sa.Column("arrived", sa.Date, nullable=False),
                            sa.Column("patient", sa.Text, nullable=False))
            rows.create(conn, checkfirst=True)
            there = set(conn.scalars(sa.select(rows.c.visit)))
            new = frame[~frame["visit"].isin(there)]
            if len(new):
                records = new.assign(arrived=new["arrived"].map(dt.date.fromisoformat)).to_dict("records")
                conn.execute(rows.insert(), [{k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()}
                                             for r in records])
    finally:
        engine.dispose()
    return len(new)


def grow_stream_table(url: str, table: str, moment: dt.datetime) -> int:
    """The example's nightly ETL into a table: the rows arrived by ``moment`` inserted, the stream going on from
    its first row; an empty table starts the stream 8 days back. It never deletes a row: a team's table holds
    people the ledger has charged, and a row removed and written again would come back as new. Returns the rows
    the table holds."""
    import sqlalchemy as sa

    today = moment.astimezone(dt.timezone.utc).date()
    start = today - dt.timedelta(days=8)
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            if sa.inspect(conn).has_table(table):
                first = conn.execute(sa.text(f'SELECT MIN(arrived) FROM "{table}"')).scalar()
                if first is not None:
                    start = first if isinstance(first, dt.date) else dt.date.fromisoformat(str(first)[:10])
    finally:
        engine.dispose()
    insert_stream(url, table, moment, start=start)
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text(f'SELECT COUNT(*) FROM "{table}"')).scalar_one())
    finally:
        engine.dispose()


def _written_as_of(as_of: Optional[str]) -> dt.datetime:
    """When the export writes as of: the flow run's scheduled time. A deployment's run takes no other (a Prefect
    user's parameter would have the ETL write rows that have not arrived), and no moment is in the future."""
    from flows.window import as_of_moment
    from flows.worker_config import deployment_run

    if as_of is not None and deployment_run():
        raise ValueError("as_of: a deployment's export writes the rows arrived by its scheduled time; remove as_of "
                         "(schedule the run instead)")
    moment = as_of_moment(as_of)
    if moment > dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=5):
        raise ValueError(f"as_of: {moment.isoformat()} is in the future; an export writes only what has arrived")
    return moment


@flow(name="grow-stream", log_prints=True)
def grow_stream(spec_path: str, as_of: Optional[str] = None, writer_url: Optional[str] = None) -> int:
    """The example's nightly export: writes the spec's source file as of the flow run's scheduled time. The
    stream goes on from where the file's rows start while they are current (its newest row arrived at most
    a day before); a file that is missing or stale (the shipped one, from 2026-09-08) starts the stream again
    8 days back, so the nightly retrain has a full window of 7 sealed days from its first night. A spec that
    reads a table (data.source.kind sql) has the night's rows inserted there, as ``writer_url`` (the ETL's
    role: the spec's URL names the reading role, which may only SELECT)."""
    import pandas as pd

    spec = specs.load_spec(spec_path)
    moment = _written_as_of(as_of)
    if spec.data.source.kind == "sql":
        if not writer_url:
            raise ValueError("writer_url: a table is written by its ETL's role, not the spec's reading one; give "
                             "the URL of a role that may create and insert (its password from libpq's PGPASSFILE)")
        rows = grow_stream_table(writer_url, spec.data.source.table, moment)
        print(f"{spec.data.source.table}: {rows} rows")
        return rows
    path = Path(spec.data.source.path)
    today = moment.astimezone(dt.timezone.utc).date()
    start = today - dt.timedelta(days=8)
    if path.is_file():
        arrived = pd.read_csv(path, usecols=["arrived"])["arrived"].map(dt.date.fromisoformat)
        if len(arrived) and arrived.max() >= today - dt.timedelta(days=1):
            start = arrived.min()
    rows = write_stream(path, moment, start=start)
    print(f"{spec.data.source.path}: {rows} rows, arriving from {start}")
    return rows


@dataclass(frozen=True)
class Night:
    night: str
    status: str  # committed | refused: the line
    window: str
    epsilon: Optional[float]
    model_epsilon: Optional[float]


def simulate(spec_path: str, nights: int, first: Optional[dt.date] = None,
             folder: Optional[Path] = None) -> Dict[str, object]:
    """``nights`` nights of the spec at 02:00 UTC from ``first`` (default: the first night whose window is
    full), on a ledger, MLflow store and stream file of their own in ``folder`` (a new temporary folder by
    default). Returns the nights and the blocks as the ledger has them after the last night."""
    import mlflow

    from flows.ledger import PrivacyLedger
    from flows.private_train import private_train

    spec = specs.load_spec(spec_path)
    if spec.data.blocks is None or spec.budget is None or spec.budget.window is None:
        raise ValueError("simulate: the spec reads no blocks; give data.blocks and budget.window")
    folder = Path(folder or tempfile.mkdtemp(prefix="privzo-simulate-"))
    folder.mkdir(parents=True, exist_ok=True)
    d = spec.model_dump(mode="json")
    table = spec.data.source.kind == "sql"
    if table:  # the stream as a SQLite table of its own, rows inserted night by night
        d["data"]["source"]["url"] = f"sqlite:///{folder / 'stream.db'}"
    else:
        d["data"]["source"]["path"] = str(folder / "stream.csv")
    d["tracking"]["uri"] = f"sqlite:///{folder / 'mlflow.db'}"
    d["budget"]["ledger"] = f"sqlite:///{folder / 'ledger.db'}"
    d["checkpoint"]["dir"] = str(folder / "checkpoints")
    # the runs' artifacts in the folder too: a SQLite store's new experiment otherwise keeps them in ./mlruns
    # of wherever simulate was started
    client = mlflow.MlflowClient(d["tracking"]["uri"])
    experiment = spec.tracking.experiment or spec.name
    if client.get_experiment_by_name(experiment) is None:
        client.create_experiment(experiment, artifact_location=(folder / "mlruns").resolve().as_uri())
    first = first or STREAM_START + dt.timedelta(days=spec.budget.window.blocks)
    played: List[Night] = []
    for n in range(nights):
        moment = dt.datetime.combine(first + dt.timedelta(days=n), dt.time(2), tzinfo=dt.timezone.utc)
        if table:
            insert_stream(d["data"]["source"]["url"], spec.data.source.table, moment)
        else:
            write_stream(folder / "stream.csv", moment)
        state = private_train(spec=copy.deepcopy(d), as_of=moment.isoformat(), return_state=True)
        if state.is_completed():
            result = state.result()
            played.append(Night(moment.date().isoformat(), "committed", _window(result), result["epsilon"],
                                result["model_epsilon"]))
        else:
            played.append(Night(moment.date().isoformat(), f"refused: {state.message}", "", None, None))
    ledger = PrivacyLedger.open(d["budget"]["ledger"])
    return {"folder": str(folder), "nights": played, "blocks": ledger.blocks(spec.budget.dataset),
            "lifetime": spec.budget.lifetime_epsilon, "spent": ledger.spent(spec.budget.dataset)}


def _window(result: dict) -> str:
    blocks = result.get("blocks") or []
    return f"{blocks[0]} .. {blocks[-1]}" if blocks else ""
