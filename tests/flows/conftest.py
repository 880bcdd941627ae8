import os
import subprocess

import pytest


@pytest.fixture(scope="module")
def postgres_url():
    """A real PostgreSQL on 127.0.0.1 (installed and started by infra/postgres/test-db.sh), stopped after."""
    import subprocess
    import uuid
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "infra" / "postgres" / "test-db.sh"
    out = subprocess.run(["bash", str(script), "start"], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        pytest.skip(f"PostgreSQL could not be started here ({out.stderr.strip().splitlines()[-1:]}); "
                    "run infra/postgres/test-db.sh start as root")
    state, url = out.stdout.strip().splitlines()[-2:]
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    with engine.begin() as conn:  # a fresh schema per test session: no state from earlier runs
        schema = f"t{uuid.uuid4().hex[:12]}"
        conn.execute(sa.text(f"CREATE SCHEMA {schema}"))
    yield f"{url}?options=-csearch_path%3D{schema}"
    with engine.begin() as conn:
        conn.execute(sa.text(f"DROP SCHEMA {schema} CASCADE"))
    engine.dispose()
    # stop only what the tests started, and never under xdist: this fixture runs once per worker, and the
    # worker that started the server may finish while another still uses it
    if state == "started" and not os.environ.get("PYTEST_XDIST_WORKER"):
        subprocess.run(["bash", str(script), "stop"], capture_output=True, timeout=120)


def as_postgres(*sql) -> None:
    """Statements run by the test server's superuser (roles are made and dropped so; the server's script ran
    as root)."""
    subprocess.run(["su", "postgres", "-c", "psql -q -d privzo " + " ".join(f"-c \"{q}\"" for q in sql)],
                   check=True, capture_output=True, timeout=60)
