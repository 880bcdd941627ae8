"""Reading a window from a database table (data.source.kind sql): rows per second and peak memory.

    .venv/bin/python bench/sql_read.py [--rows 1000000] [--columns 20] [--days 100] [--window 7] [--sqlite]

Fills a table of ``rows`` rows (``columns`` float features, a label, an arrival timestamp spread over
``days`` days, a bigint primary key) in the test PostgreSQL (infra/postgres/test-db.sh start, as root), or a
SQLite file with --sqlite, then reads it as a nightly run does (components/data/sql.py: the WHERE on the
arrival pushed down, row_id order, a server-side cursor in chunks), each read in a process of its own:
the whole table (a window of every day) and a window of ``window`` days. Prints rows per second and the
read's peak resident memory over the process's before it (ru_maxrss), against the window's rows as float32
(rows x columns x 4 bytes). The floor of the whole read is the driver's fetch of the same rows with no
conversion (a plain fetchall of the same SELECT), measured in the same run.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)

CHILD = r"""
import json, resource, sys, time, datetime as dt
import pandas, psycopg  # imported before the read is measured: the read's memory, not the imports'
import sqlalchemy as sa
import specs
from components.data.blocks import window_bounds
from components.data.sql import load_sql
import os
args = json.loads(sys.argv[1])
url = sa.engine.make_url(args["url"])  # a spec's URL names no password: the bench's goes by the environment
os.environ["PRIVZO_BENCH_PASSWORD"] = url.password or ""
bare = sa.engine.URL.create(url.drivername, username=url.username, host=url.host, port=url.port,
                            database=url.database, query=url.query).render_as_string(hide_password=False)
source = specs.sections.SqlSource(kind="sql", url=bare, table="rows", label="label", classes=[0, 1], row_id="id",
                                  password_env="PRIVZO_BENCH_PASSWORD" if url.password else None)
blocks = specs.sections.BlocksSpec(arrival="arrived", period="day", declared_private_rows=1000)
within = window_bounds(args["blocks"], "day")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
started = time.perf_counter()
if args["plain"]:  # the driver's fetch alone: the same SELECT, rows kept as the driver gives them
    engine = sa.create_engine(args["url"])
    with engine.connect() as conn:
        cols = ", ".join(["id", "label", "arrived"] + [f"f{i}" for i in range(args["columns"])])
        n = len(conn.exec_driver_sql(f"SELECT {cols} FROM rows ORDER BY id").fetchall())
else:
    n = len(load_sql(source, blocks=blocks, within=within))
seconds = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"rows": n, "seconds": seconds, "extra_bytes": max(0, peak - before)}))
"""


def fill(url: str, rows: int, columns: int, days: int) -> None:
    import numpy as np
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    meta = sa.MetaData()
    table = sa.Table("rows", meta, sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
                     sa.Column("label", sa.Integer, nullable=False), sa.Column("arrived", sa.DateTime(timezone=True)),
                     *[sa.Column(f"f{i}", sa.Float) for i in range(columns)], sa.Index("rows_arrived", "arrived"))
    rng = np.random.default_rng(0)
    with engine.begin() as conn:
        meta.drop_all(conn)
        meta.create_all(conn)
    chunk = 100_000
    for lo in range(0, rows, chunk):
        n = min(chunk, rows - lo)
        values = rng.standard_normal((n, columns))
        seconds = np.sort(rng.integers(0, days * 86400, n))
        if engine.dialect.name == "postgresql":  # COPY: the fill is not what is measured
            import io

            buffer = io.StringIO()
            for i in range(n):
                at = (START + dt.timedelta(seconds=int(seconds[i]))).isoformat()
                buffer.write(f"{lo + i}\t{int(values[i, 0] > 0)}\t{at}\t" + "\t".join(f"{v:.6g}" for v in values[i]) + "\n")
            buffer.seek(0)
            raw = engine.raw_connection()
            try:
                with raw.cursor() as cursor, cursor.copy("COPY rows FROM STDIN") as copy:
                    copy.write(buffer.read())
                raw.commit()
            finally:
                raw.close()
        else:
            with engine.begin() as conn:
                conn.execute(table.insert(), [
                    {"id": lo + i, "label": int(values[i, 0] > 0),
                     "arrived": (START + dt.timedelta(seconds=int(seconds[i]))).replace(tzinfo=None),
                     **{f"f{j}": float(values[i, j]) for j in range(columns)}} for i in range(n)])
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql("ANALYZE rows")
    engine.dispose()


def read(url: str, blocks, columns: int, plain: bool = False) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps({"url": url, "blocks": blocks, "columns": columns,
                                                                    "plain": plain})],
                         cwd=ROOT, capture_output=True, text=True, timeout=1800, env={"PYTHONPATH": str(ROOT),
                                                                                    "PATH": "/usr/bin:/bin"})
    if out.returncode != 0:
        raise SystemExit(out.stderr.strip().splitlines()[-1])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--columns", type=int, default=20)
    parser.add_argument("--days", type=int, default=100)
    parser.add_argument("--window", type=int, default=7)
    parser.add_argument("--sqlite", action="store_true", help="a SQLite file instead of the test PostgreSQL")
    args = parser.parse_args()
    if args.sqlite:
        url = f"sqlite:///{Path(tempfile.mkdtemp(prefix='privzo-sql-bench-')) / 'rows.db'}"
    else:
        out = subprocess.run(["bash", str(ROOT / "infra" / "postgres" / "test-db.sh"), "start"], capture_output=True,
                             text=True, timeout=600)
        if out.returncode != 0:
            raise SystemExit(f"PostgreSQL could not be started: {out.stderr.strip()[-300:]}")
        url = out.stdout.strip().splitlines()[-1]
    started = time.perf_counter()
    fill(url, args.rows, args.columns, args.days)
    print(f"filled {args.rows} rows x {args.columns} float columns in {time.perf_counter() - started:.1f} s "
          f"({'SQLite' if args.sqlite else 'PostgreSQL'})")
    days = [(START + dt.timedelta(days=d)).date().isoformat() for d in range(args.days)]
    print(f"{'read':<22} {'rows':>9} {'seconds':>8} {'rows/s':>10} {'peak MiB':>9} {'float32 MiB':>11} {'ratio':>6}")
    plain = read(url, days, args.columns, plain=True)
    for name, blocks, row in (("driver fetchall (floor)", days, plain),
                              ("whole table", days, None),
                              (f"window of {args.window} days", days[-args.window:], None)):
        row = row or read(url, blocks, args.columns)
        floor = row["rows"] * args.columns * 4
        print(f"{name:<22} {row['rows']:>9} {row['seconds']:>8.2f} {row['rows'] / row['seconds']:>10.0f} "
              f"{row['extra_bytes'] / 2**20:>9.1f} {floor / 2**20:>11.1f} {row['extra_bytes'] / max(floor, 1):>6.2f}")
    # the table goes: left in the test database, its autovacuum would load the machine for minutes after
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE IF EXISTS rows")
    engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
