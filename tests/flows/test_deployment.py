"""End to end as a user runs it on a team's topology: the local stack on PostgreSQL, the compose file.
The default stack's deployment runs and UIs: tests/flows/test_nightly.py."""
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import mlflow
import pytest
import sqlalchemy as sa
import yaml

from flows.record.tracking_names import DP_EPSILON, DP_GUARANTEE, PRIVACY_REPORT_ARTIFACT

# one stack per checkout (.privzo-stack): with tests/flows/test_nightly.py, run in turn by one worker
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("local-stack")]
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
STACK = ROOT / "infra" / "local-stack.sh"
POSTGRES = ROOT / "infra" / "postgres" / "test-db.sh"
PG_HOST = "127.0.0.1:5432"
# the stack's own roles and databases (infra/local-stack.sh), made afresh for each test
STACK_ROLES, STACK_DATABASES = ("privzo_owner", "privzo_worker", "privzo_prefect", "privzo_mlflow", "privzo_etl",
                                 "privzo_reader"), ("privzo_ledger", "privzo_prefect", "privzo_mlflow", "privzo_data")


# the servers' startup, not what is asserted: one MLflow worker process instead of 4 (each imports MLflow,
# ~20 s of a 2-core machine), and a Prefect worker that polls for flow runs every second, not every 10
QUICK = {"MLFLOW_WORKERS": "1", "PREFECT_WORKER_QUERY_SECONDS": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def local_stack(tmp_path, **env_extra):
    """infra/local-stack.sh up on free ports (down after); yields the environment a user would export."""
    if not (BIN / "prefect").exists():
        pytest.skip("prefect CLI not next to this interpreter")
    for pid_file in (ROOT / ".privzo-stack").glob("*.pid"):  # its pid files would be taken over, its processes leaked
        with contextlib.suppress(ValueError, ProcessLookupError):
            os.killpg(int(pid_file.read_text().strip()), 0)
            pytest.fail(f"a local stack is running from {pid_file.parent}; stop it first (make down)")
    env = dict(QUICK, **os.environ)
    env.update(PRIVZO_PREFECT_PORT=str(_free_port()), PRIVZO_MLFLOW_PORT=str(_free_port()),
               PREFECT_HOME=str(tmp_path / "prefect-home"), **env_extra)
    for name in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "PRIVZO_LEDGER_URL"):
        env.pop(name, None)
    up = subprocess.run(["bash", str(STACK), "up"], env=env, capture_output=True, text=True, timeout=400, cwd=ROOT)
    try:
        if up.returncode != 0:  # the logs go with the state folder: say what they said
            logs = "".join(f"\n== {log.name}\n" + log.read_text(errors="replace")[-1500:]
                           for log in sorted((ROOT / ".privzo-stack").glob("*.log")))
            pytest.fail(f"local-stack.sh up failed: {up.stderr[-2000:]}{logs}")
        env["PREFECT_API_URL"] = f"http://127.0.0.1:{env['PRIVZO_PREFECT_PORT']}/api"
        yield env, up.stdout
    finally:
        subprocess.run(["bash", str(STACK), "down"], env=env, capture_output=True, timeout=120, cwd=ROOT)
        shutil.rmtree(ROOT / ".privzo-stack", ignore_errors=True)


def deployment_run(env, spec_path):
    run = subprocess.run(
        [str(BIN / "prefect"), "deployment", "run", "private-train/digits-retrain-nightly",
         "--param", f"spec_path={spec_path}", "--watch", "--watch-timeout", "300"],
        env=env, capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert run.returncode == 0 and "Completed" in run.stdout, run.stdout[-2000:] + run.stderr[-2000:]


def one_epoch_retrain(tmp_path, **sections):
    spec = yaml.safe_load((ROOT / "specs" / "examples" / "digits_retrain.yaml").read_text())
    spec["optimizer"]["epochs"] = 1
    for section, values in sections.items():
        spec[section].update(values)
    path = tmp_path / "retrain.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture
def stack_databases():
    """A real PostgreSQL (infra/postgres/test-db.sh; its test role privzo/privzo too) without the stack's roles
    and databases, which the stack makes."""
    started = subprocess.run(["bash", str(POSTGRES), "start"], capture_output=True, text=True, timeout=600)
    if started.returncode != 0:
        pytest.skip(f"PostgreSQL could not be started here ({started.stderr.strip().splitlines()[-1:]}); "
                    "run infra/postgres/test-db.sh start as root")

    def drop():
        sql = [f"DROP DATABASE IF EXISTS {d} WITH (FORCE)" for d in STACK_DATABASES]
        sql += [f"DROP ROLE IF EXISTS {r}" for r in STACK_ROLES]
        subprocess.run(["su", "postgres", "-c", "psql -q " + " ".join(f"-c '{q}'" for q in sql)],
                       capture_output=True, timeout=120, check=True)

    drop()
    yield
    drop()
    # stop only what the test started, and never under xdist: other workers' tests may use the server
    if started.stdout.split()[0] == "started" and not os.environ.get("PYTEST_XDIST_WORKER"):
        subprocess.run(["bash", str(POSTGRES), "stop"], capture_output=True, timeout=120)


@pytest.fixture
def shared(tmp_path):
    """A folder the stack's roles can read (a flow run on the team stack runs as privzo-train, which cannot
    enter this test's own tmp_path), with ``drop/`` they can write."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="privzo-team-"))
    folder.chmod(0o755)
    (folder / "drop").mkdir(mode=0o1777)
    (folder / "drop").chmod(0o1777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _uid_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])


def _secrets():
    import secrets

    return {"PRIVZO_PREFECT_AUTH_STRING": f"admin:{secrets.token_hex(12)}",
            "PRIVZO_MLFLOW_ADMIN_PASSWORD": secrets.token_hex(12), "PRIVZO_MLFLOW_WORKER_PASSWORD": secrets.token_hex(12),
            "PRIVZO_MLFLOW_VIEWER_PASSWORD": secrets.token_hex(12), "PRIVZO_RAY_TOKEN": secrets.token_hex(32),
            "PRIVZO_LEDGER_WORKER_PASSWORD": secrets.token_hex(12),
            # quotes and a URL's reserved characters: they reach psql and the URLs intact
            "PRIVZO_LEDGER_OWNER_PASSWORD": f"o'w\"n@r:/{secrets.token_hex(8)}",
            "PRIVZO_PREFECT_DB_PASSWORD": secrets.token_hex(12), "PRIVZO_MLFLOW_DB_PASSWORD": secrets.token_hex(12)}


def test_the_authenticated_stack_refuses_to_start_without_a_secret_naming_it(tmp_path):
    env = dict(os.environ, PRIVZO_STACK_AUTH="1", PRIVZO_STACK_RAY="1", **_secrets())
    del env["PRIVZO_MLFLOW_VIEWER_PASSWORD"]
    (tmp_path / "worker-password").write_text(env.pop("PRIVZO_MLFLOW_WORKER_PASSWORD") + "\n")
    env["PRIVZO_MLFLOW_WORKER_PASSWORD_FILE"] = str(tmp_path / "worker-password")  # a file is as good
    up = subprocess.run(["bash", str(STACK), "up"], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert up.returncode == 2 and up.stdout == ""
    assert up.stderr == ("local-stack: PRIVZO_STACK_AUTH=1 needs PRIVZO_MLFLOW_VIEWER_PASSWORD (or "
                         "PRIVZO_MLFLOW_VIEWER_PASSWORD_FILE, a file holding it)\n")
    assert not list((ROOT / ".privzo-stack").glob("*.pid"))  # nothing started
    # on PostgreSQL the ledger's owner is the team's, its password theirs: never a repository constant
    env = dict(os.environ, PRIVZO_STACK_AUTH="1", PRIVZO_STACK_DB="postgres", **_secrets())
    del env["PRIVZO_LEDGER_OWNER_PASSWORD"]
    up = subprocess.run(["bash", str(STACK), "up"], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert up.returncode == 2 and up.stderr == ("local-stack: PRIVZO_STACK_AUTH=1 needs PRIVZO_LEDGER_OWNER_PASSWORD "
                                                "(or PRIVZO_LEDGER_OWNER_PASSWORD_FILE, a file holding it)\n")
    # a team stack runs each role as an OS user of its own: started by anyone but root, it cannot drop to them
    if os.geteuid() == 0 and shutil.which("setpriv"):
        env = dict(os.environ, PRIVZO_STACK_AUTH="1", PRIVZO_STACK_DB="postgres", **_secrets())
        up = subprocess.run(["setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups", "bash", str(STACK),
                             "up"], env=env, capture_output=True, text=True, timeout=60, cwd="/")
        assert up.returncode == 2 and up.stderr.startswith("local-stack: a team stack (PRIVZO_STACK_AUTH=1 with "
                                                           "PRIVZO_STACK_DB=postgres) runs each server"), up.stderr
        assert "start it as root, which drops to those users before any flow runs" in up.stderr


def _connects(role: str, password: str, database: str) -> bool:
    import psycopg

    try:
        psycopg.connect(host="127.0.0.1", port=5432, user=role, password=password, dbname=database,
                        connect_timeout=10).close()
        return True
    except psycopg.OperationalError:
        return False


def _status(url, method="GET", auth=None, bearer=None, body=None) -> int:
    import base64
    import json
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    if bearer:
        request.add_header("Authorization", f"Bearer {bearer}")
    try:
        return urllib.request.urlopen(request, timeout=30).status
    except urllib.error.HTTPError as err:
        return err.code


def test_the_postgres_stack_keeps_prefect_mlflow_and_the_ledger_on_the_server(tmp_path, stack_databases, shared,
                                                                              monkeypatch):
    """The team topology of infra/compose on one machine, every service behind its own authentication: a
    deployment run (with the Prefect auth string) of a spec that names no store is tracked by the MLflow
    server as user worker (runs and registry in PostgreSQL, artifacts served by it) and charged to the
    PostgreSQL ledger, and Prefect keeps its flow runs in PostgreSQL. Without credentials the Prefect API,
    MLflow (read and write) and Ray's job API refuse; a viewer reads but registers, tags and creates
    nothing. Each role runs as an OS user of its own, never root; a flow run reads no other role's files or
    processes."""
    import pwd

    # the team stack drops to an OS user per role, and gives each the venv's interpreter where it cannot reach it
    if os.geteuid() != 0:
        pytest.skip("the team stack starts as root, which drops to an OS user per role; this test runs as "
                    f"uid {os.geteuid()}")
    dropped = subprocess.run(["bash", str(ROOT / "infra" / "stack" / "as-role.sh"), "check", "nobody"],
                             capture_output=True, text=True, timeout=60)
    if dropped.returncode != 0:
        pytest.skip(f"the team stack cannot run its roles here: {dropped.stderr.strip()}")
    spec_path = one_epoch_retrain(shared)
    secrets = _secrets()
    with local_stack(tmp_path, PRIVZO_STACK_DB="postgres", PRIVZO_STACK_AUTH="1", PRIVZO_STACK_RAY="1",
                     PRIVZO_RAY_PORT=str(_free_port()), PRIVZO_RAY_DASHBOARD_PORT=str(_free_port()),
                     **secrets) as (env, exports):
        server = f"http://127.0.0.1:{env['PRIVZO_MLFLOW_PORT']}"
        owner_env = f"postgresql+psycopg://privzo_owner@{PG_HOST}/privzo_ledger"  # libpq adds PGPASSWORD
        assert f"MLFLOW_TRACKING_URI={server} PRIVZO_LEDGER_URL={owner_env}" in exports
        assert 'export PGPASSWORD="$PRIVZO_LEDGER_OWNER_PASSWORD"' in exports
        assert not any(value in exports for value in secrets.values())  # named, never printed
        # every role its own OS user, none root: the servers, both workers (so every flow run) and the Ray head
        state = ROOT / ".privzo-stack"
        runs_as = {p.stem: pwd.getpwuid(_uid_of(int(p.read_text()))).pw_name for p in state.glob("*.pid")}
        assert runs_as == {"prefect-server": "privzo-prefect", "mlflow": "privzo-mlflow",
                           "prefect-worker": "privzo-train", "prefect-etl-worker": "privzo-etl",
                           "ray-head": "privzo-train"}
        # the training worker reads the team's rows only; the ETL's worker alone holds the writer's password
        assert (state / "pgpass").read_text().split(":")[3] == "privzo_reader" and \
            len((state / "pgpass").read_text().splitlines()) == 1
        assert (state / "pgpass-etl").read_text().split(":")[3] == "privzo_etl"
        for path, user in ((state / "pgpass", "privzo-train"), (state / "pgpass-etl", "privzo-etl")):
            assert pwd.getpwuid(path.stat().st_uid).pw_name == user and path.stat().st_mode & 0o077 == 0
        owner = owner_env.replace("privzo_owner@", f"privzo_owner:{quote(secrets['PRIVZO_LEDGER_OWNER_PASSWORD'], safe='')}@")
        kept = {n: (ROOT / ".privzo-stack" / f"{n}-db-password").read_text().strip()
                for n in ("prefect", "mlflow", "etl", "reader")}
        # no secret on any process's command line (ps shows those to every user of the machine)
        every = [*secrets.values(), *kept.values(), quote(secrets["PRIVZO_LEDGER_OWNER_PASSWORD"], safe="")]
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            with contextlib.suppress(OSError):
                shown = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
                assert not any(s in shown for s in every), f"a secret on the command line of {cmdline.parent.name}"
        # each server reaches its own database only, the worker the ledger's; the tests' own role none of them
        logins = {"privzo_prefect": kept["prefect"], "privzo_mlflow": kept["mlflow"],
                  "privzo_worker": secrets["PRIVZO_LEDGER_WORKER_PASSWORD"], "privzo": "privzo",
                  "privzo_etl": kept["etl"], "privzo_reader": kept["reader"]}
        reached = {(role, d) for role, password in logins.items() for d in STACK_DATABASES
                   if _connects(role, password, d)}
        assert reached == {("privzo_prefect", "privzo_prefect"), ("privzo_mlflow", "privzo_mlflow"),
                           ("privzo_worker", "privzo_ledger"), ("privzo_etl", "privzo_data"),
                           ("privzo_reader", "privzo_data")}
        prefect_api, ray_jobs = env["PREFECT_API_URL"], f"http://127.0.0.1:{env['PRIVZO_RAY_DASHBOARD_PORT']}/api/jobs/"
        assert _status(f"{prefect_api}/deployments/filter", "POST", body={}) == 401
        assert _status(f"{prefect_api}/deployments/filter", "POST", auth="admin:wrong", body={}) == 401
        assert _status(f"{server}/api/2.0/mlflow/experiments/search?max_results=1") == 401
        assert _status(f"{server}/api/2.0/mlflow/experiments/create", "POST", body={"name": "x"}) == 401
        assert _status(ray_jobs) == 401 and _status(ray_jobs, "POST", body={"entrypoint": "id"}) == 401
        assert _status(ray_jobs, bearer="0" * 64) == 403
        assert _status(ray_jobs, bearer=secrets["PRIVZO_RAY_TOKEN"]) == 200
        # the worker charges the ledger as privzo_worker: registered datasets only, and only the owner registers
        from flows.ledger import PrivacyLedger

        worker_ledger = PrivacyLedger(owner_env.replace("privzo_owner@", "privzo_worker:"
                                                        f"{secrets['PRIVZO_LEDGER_WORKER_PASSWORD']}@"))
        assert worker_ledger.missing_write_grants() == [] and not worker_ledger.may_register()
        worker_ledger.engine.dispose()
        # the owner registers as the exports say: the URL without its password, the password from PGPASSWORD
        registered = subprocess.run([sys.executable, "-m", "flows.cli", "budget", "init", "sklearn-digits", "--spec",
                                     str(spec_path)], capture_output=True, text=True, timeout=120, cwd=ROOT,
                                    env=dict(os.environ, PRIVZO_LEDGER_URL=owner_env,
                                             PGPASSWORD=secrets["PRIVZO_LEDGER_OWNER_PASSWORD"]))
        assert registered.returncode == 0 and "sklearn-digits: registered in" in registered.stdout, registered.stderr
        env["PREFECT_API_AUTH_STRING"] = secrets["PRIVZO_PREFECT_AUTH_STRING"]
        deployment_run(env, spec_path)
        # the stream in the team's database: the owner registers it, the ETL deployment inserts the days' rows
        # as privzo_etl, the nightly reads its window as privzo_reader (SELECT only) and registers a version
        team_spec = ROOT / "infra" / "stack" / "digits_stream_team.yaml"
        registered = subprocess.run([sys.executable, "-m", "flows.cli", "budget", "init", "digits-stream-team",
                                     "--spec", str(team_spec)], capture_output=True, text=True, timeout=120, cwd=ROOT,
                                    env=dict(os.environ, PRIVZO_LEDGER_URL=owner_env,
                                             PGPASSWORD=secrets["PRIVZO_LEDGER_OWNER_PASSWORD"]))
        assert registered.returncode == 0, registered.stderr
        for name in ("grow-stream/digits-stream-team-grow", "private-train/digits-stream-team-nightly"):
            run = subprocess.run([str(BIN / "prefect"), "deployment", "run", name, "--watch", "--watch-timeout", "300"],
                                 env=env, capture_output=True, text=True, timeout=400, cwd=ROOT)
            assert run.returncode == 0 and "Completed" in run.stdout, name + run.stdout[-2000:] + run.stderr[-2000:]
        reader = sa.create_engine(f"postgresql+psycopg://privzo_reader:{kept['reader']}@{PG_HOST}/privzo_data")
        with reader.connect() as conn:
            assert conn.execute(sa.text("SELECT COUNT(*) FROM visits")).scalar_one() > 0
            with pytest.raises(sa.exc.ProgrammingError, match="permission denied"):
                conn.execute(sa.text("DELETE FROM visits"))
        reader.dispose()
        # a Prefect user's spec that names a ledger of its own (its own lifetime), with the job variable that
        # sets the run's $PRIVZO_LEDGER_URL to it, is refused on the team's worker before any row is read: the
        # worker's configuration, not the run's environment, names the team's ledger
        (shared / "own").mkdir(mode=0o777)
        (shared / "own").chmod(0o777)  # the flow run could write its ledger here: it is refused first
        own_ledger = f"sqlite:///{shared / 'own' / 'own.db'}"
        own = one_epoch_retrain(shared / "own", budget={"ledger": own_ledger, "lifetime_epsilon": 1000.0})
        refused = subprocess.run(
            [str(BIN / "prefect"), "deployment", "run", "private-train/digits-retrain-nightly",
             "--param", f"spec_path={own}", "--job-variable", f'env={{"PRIVZO_LEDGER_URL": "{own_ledger}"}}',
             "--watch", "--watch-timeout", "300"],
            env=env, capture_output=True, text=True, timeout=400, cwd=ROOT)
        assert "Completed" not in refused.stdout and "Failed" in refused.stdout, refused.stdout[-2000:]
        assert not (shared / "own" / "own.db").exists()

        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "viewer")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", secrets["PRIVZO_MLFLOW_VIEWER_PASSWORD"])
        client = mlflow.MlflowClient(server)
        (finished,) = client.search_runs([client.get_experiment_by_name("digits-retrain").experiment_id])
        assert finished.info.status == "FINISHED" and finished.info.artifact_uri.startswith("mlflow-artifacts:/")
        assert finished.data.params["tracking.uri"] == server  # the resolved spec says where it went
        # every deployment run's steps ran on the stack's Ray (the worker's configuration names its head), the
        # team's SQL nightly too: its workers read the window from privzo_data as privzo_reader
        head = f"127.0.0.1:{env['PRIVZO_RAY_PORT']}"
        (nightly,) = client.search_runs([client.get_experiment_by_name("digits-stream-team").experiment_id])
        for run in (finished, nightly):
            assert (run.data.params["execution.backend"], run.data.params["execution.address"]) == ("ray", head)
        # the worker's ledger role, its password never logged (every MLflow reader sees the params)
        assert finished.data.params["budget.ledger"] == "postgresql+psycopg://privzo_worker:***@127.0.0.1:5432/privzo_ledger"
        assert not any(secret in str(finished.data.params) for secret in secrets.values())
        report = Path(client.download_artifacts(finished.info.run_id, PRIVACY_REPORT_ARTIFACT, str(tmp_path)))
        assert finished.data.tags[DP_GUARANTEE] in report.read_text()
        (version,) = client.search_model_versions("name='digits-retrain'")
        assert version.run_id == finished.info.run_id and version.tags[DP_EPSILON] == finished.data.tags[DP_EPSILON]

        (charge,) = PrivacyLedger(owner).history("sklearn-digits")
        assert charge.status == "committed" and charge.run_id == finished.info.run_id

        # the worker's own SQL cannot rewrite the committed charge (fewer steps: a smaller epsilon)
        engine = sa.create_engine(worker_ledger.engine.url)
        with pytest.raises(sa.exc.DBAPIError, match="a settled charge never changes"), engine.begin() as conn:
            conn.execute(sa.text("UPDATE privzo_charges SET steps_run = 1 WHERE id = :i"), {"i": charge.id})
        engine.dispose()
        from mlflow.exceptions import MlflowException

        for forge in (lambda: client.create_model_version("digits-retrain", version.source, version.run_id),
                      lambda: client.set_model_version_tag("digits-retrain", version.version, DP_EPSILON, "0.1"),
                      lambda: client.update_model_version("digits-retrain", version.version, "epsilon 0.1"),
                      lambda: client.create_registered_model("forged"), lambda: client.create_experiment("forged")):
            with pytest.raises(MlflowException, match="PERMISSION_DENIED|403"):
                forge()
        assert client.get_model_version("digits-retrain", version.version).tags == version.tags
        # read-only is an allow-list: the writes basic-auth leaves to any signed-in user are refused too
        viewer = f"viewer:{secrets['PRIVZO_MLFLOW_VIEWER_PASSWORD']}"
        for path, body in (("/api/3.0/mlflow/gateway/secrets/create", {"secret_name": "x", "secret_value": {"k": "v"}}),
                           ("/ajax-api/3.0/mlflow/demo/generate", {}),
                           ("/api/3.0/mlflow/datasets/create", {"name": "x"})):
            assert _status(server + path, "POST", auth=viewer, body=body) == 403, path
        # and on the routes MLflow serves on FastAPI ahead of its Flask app (the ASGI door, flows/record/mlflow_app.py)
        for method, path, body in (("POST", "/ajax-api/3.0/mlflow/mcp-servers", {"name": "x", "url": "http://x"}),
                                   ("PUT", "/ajax-api/3.0/mlflow/assistant/config", {"provider": "x"}),
                                   ("POST", "/ajax-api/3.0/jobs/", {"function_fullname": "os.system", "params": {}})):
            assert _status(server + path, method, auth=viewer, body=body) == 403, path
        assert _status(f"{server}/api/2.0/mlflow/runs/search", "POST", auth=viewer,
                       body={"experiment_ids": [finished.info.experiment_id]}) == 200

        # a viewer checks the version: the logged ledger URL has no password, so verify asks for one
        from flows.record.verify import verify

        monkeypatch.delenv("PRIVZO_LEDGER_URL", raising=False)
        asked = verify("digits-retrain", version.version, tracking_uri=server)
        assert not asked.passed and "without its password; give --ledger" in asked.first_mismatch
        checked = verify("digits-retrain", version.version, tracking_uri=server, ledger_url=owner)
        assert checked.passed, checked.first_mismatch
        # its data source is read as a run reads it: the reading role, its password from libpq's PGPASSFILE
        monkeypatch.setenv("PGPASSFILE", str(ROOT / ".privzo-stack" / "pgpass"))
        team = verify("digits-stream-team", "1", tracking_uri=server, ledger_url=owner)
        assert team.passed, team.first_mismatch

        engine = sa.create_engine(f"postgresql+psycopg://privzo_prefect:{kept['prefect']}@{PG_HOST}/privzo_prefect")
        with engine.connect() as conn:
            states = conn.execute(sa.text("SELECT state_name FROM flow_run")).scalars().all()
        engine.dispose()
        assert sorted(states) == ["Completed", "Completed", "Completed", "Failed"]

        # the ledger owner promotes the nightly version: it passes against the team's ledger, so it gets the
        # alias consumers load; a version registered by hand from the same run (no tags) does not
        from flows.record.verify import verify_command

        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", secrets["PRIVZO_MLFLOW_ADMIN_PASSWORD"])
        admin = mlflow.MlflowClient(server)
        assert verify_command("digits-retrain", version.version, tracking_uri=server, ledger_url=owner,
                              promote=True, out=open(os.devnull, "w")) == 0
        assert str(admin.get_model_version_by_alias("digits-retrain", "verified").version) == str(version.version)
        # the logged model the run's version points at, registered again by hand
        by_hand = admin.create_model_version("digits-retrain", version.source, version.run_id,
                                             model_id=version.source.removeprefix("models:/"))
        assert verify_command("digits-retrain", by_hand.version, tracking_uri=server, ledger_url=owner,
                              promote=True, out=open(os.devnull, "w")) == 1
        assert str(admin.get_model_version_by_alias("digits-retrain", "verified").version) == str(version.version)
        # @verified is the bytes the owner checked: the worker may not move the alias, a consumer loads the
        # promoted version; the server keeps every logged byte (no user overwrites or deletes an artifact), and
        # bytes changed where it keeps them (by whoever holds its disk) make the load refuse
        from flows.record.promotion import NotVerified, load_verified

        worker = f"worker:{secrets['PRIVZO_MLFLOW_WORKER_PASSWORD']}"
        assert _status(f"{server}/api/2.0/mlflow/registered-models/alias", "POST", auth=worker,
                       body={"name": "digits-retrain", "alias": "verified", "version": by_hand.version}) == 403
        # nor remove or rename what it registered (MLflow made it the model's MANAGE owner)
        for route, method, body in (("model-versions/delete", "DELETE", {"name": "digits-retrain", "version": version.version}),
                                    ("registered-models/delete", "DELETE", {"name": "digits-retrain"}),
                                    ("registered-models/rename", "POST", {"name": "digits-retrain", "new_name": "x"}),
                                    ("runs/delete", "POST", {"run_id": version.run_id})):
            assert _status(f"{server}/api/2.0/mlflow/{route}", method, auth=worker, body=body) == 403, route
        assert load_verified("digits-retrain", ledger_url=owner, tracking_uri=server, flavor="pytorch") is not None
        logged = admin.get_logged_model(version.source.removeprefix("models:/")).artifact_location
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=logged, tracking_uri=server,
                                                         dst_path=str(tmp_path / "promoted")))
        weights = next(p for p in sorted(local.rglob("*")) if p.suffix in (".pt2", ".pth", ".pt"))
        target = (f"{server}/api/2.0/mlflow-artifacts/artifacts/{logged.removeprefix('mlflow-artifacts:/')}/"
                  f"{weights.relative_to(local).as_posix()}")

        def put(data: bytes, method: str = "PUT") -> int:
            import base64
            import urllib.error
            import urllib.request

            request = urllib.request.Request(target, method=method, data=data)
            request.add_header("Authorization", "Basic " + base64.b64encode(worker.encode()).decode())
            try:
                return urllib.request.urlopen(request, timeout=30).status
            except urllib.error.HTTPError as err:
                return err.code

        assert put(b"other weights") == 403 and put(None, "DELETE") == 403
        assert put(weights.read_bytes()) == 200  # the same bytes again: a client's retry
        stored = state / "mlartifacts" / logged.removeprefix("mlflow-artifacts:/") / weights.relative_to(local)
        assert stored.read_bytes() == weights.read_bytes()
        stored.write_bytes(b"other weights")
        try:
            with pytest.raises(NotVerified, match=r"^models:/digits-retrain@verified \(version \d+\): .* is not the "
                                                  r"bytes its owner verified and promoted"):
                load_verified("digits-retrain", ledger_url=owner, tracking_uri=server)
        finally:
            stored.write_bytes(weights.read_bytes())

        # no long-running process of the stack, nor a flow run, holds the owner's or MLflow's admin's secret
        owners = [secrets["PRIVZO_LEDGER_OWNER_PASSWORD"], quote(secrets["PRIVZO_LEDGER_OWNER_PASSWORD"], safe=""),
                  secrets["PRIVZO_MLFLOW_ADMIN_PASSWORD"]]
        groups = {int(p.read_text()) for p in (ROOT / ".privzo-stack").glob("*.pid")}
        seen = 0
        for environ in Path("/proc").glob("[0-9]*/environ"):
            with contextlib.suppress(OSError, ProcessLookupError):
                if os.getpgid(int(environ.parent.name)) in groups:
                    held = environ.read_bytes().decode(errors="replace")
                    seen += 1
                    assert not any(s in held for s in owners), f"a stack process ({environ.parent.name}) holds one"
        assert seen >= 4  # the Prefect server and worker, MLflow, the Ray head (and their children)
        # a flow run, as any Prefect user can start one: the job variable `command` runs what they like as the
        # worker's OS user (docs/design.md, insiders). Here a probe, while the owner's own command runs beside
        # it with the owner's password in its environment (as `privzo budget show` has it)
        owner_command = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                         env=dict(os.environ, PRIVZO_LEDGER_URL=owner_env,
                                                  PGPASSWORD=secrets["PRIVZO_LEDGER_OWNER_PASSWORD"]))
        others = ["pgpass-etl", "mlflow-auth/users.db", "mlflow-auth.ini", "mlflow-secret-key", "prefect-db-password",
                  "mlflow-db-password", "etl-db-password", "reader-db-password", "postgres.log",
                  "home/privzo-etl", "home/privzo-mlflow", "home/privzo-prefect"]
        probe = shared / "probe.sh"
        probe.write_text("\n".join([
            "out=$1",
            "{ echo uid:$(id -u) user:$(id -un)",
            f"  cat /proc/{owner_command.pid}/environ >/dev/null 2>&1 && echo owner-environ:read || echo owner-environ:refused",
            "  su postgres -c true </dev/null >/dev/null 2>&1 && echo su-postgres:yes || echo su-postgres:no",
            "  for host in /var/run/postgresql 127.0.0.1; do",
            "    psql -w -h $host -U postgres -d postgres -tAc 'select 1' >/dev/null 2>&1 && echo superuser:$host || "
            "echo no-superuser:$host",
            "  done",
            *[f"  [ -r {state / o} ] && echo read:{o} || echo refused:{o}" for o in [*others, "pgpass"]],
            "  [ -r /etc/privzo/worker.json ] && echo read:worker.json || echo refused:worker.json",
            "  env | sed 's/^/env:/'",
            "} > $out.tmp 2>&1; mv $out.tmp $out", ""]))
        probe.chmod(0o755)

        def probed(deployment: str, name: str) -> str:
            out = shared / "drop" / name
            subprocess.run([str(BIN / "prefect"), "deployment", "run", deployment,
                            "--job-variable", f"command=sh {probe} {out}"],
                           env=env, capture_output=True, text=True, timeout=120, cwd=ROOT, check=True)
            for _ in range(240):
                if out.exists():
                    return out.read_text()
                time.sleep(0.5)
            raise AssertionError(f"the probe on {deployment} wrote nothing")

        try:
            trainer = probed("private-train/digits-retrain-nightly", "train")
            etl = probed("grow-stream/digits-stream-team-grow", "etl")
        finally:
            owner_command.kill()
        assert "user:privzo-train" in trainer and "uid:0" not in trainer, trainer
        assert "user:privzo-etl" in etl and "uid:0" not in etl, etl
        # each reads its own files only: the trainer the reading role's pgpass and the team's configuration, the
        # ETL's worker its writer's pgpass (and its home); neither the other's, the servers', nor the owner's
        for seen_by, own in ((trainer, {"pgpass", "worker.json"}), (etl, {"pgpass-etl", "home/privzo-etl"})):
            assert "owner-environ:refused" in seen_by and "su-postgres:no" in seen_by
            assert "no-superuser:/var/run/postgresql" in seen_by and "no-superuser:127.0.0.1" in seen_by
            assert {line[5:] for line in seen_by.splitlines() if line.startswith("read:")} == own, seen_by
        held = trainer
        assert "env:PREFECT__FLOW_RUN_ID=" in held and "PRIVZO_LEDGER_URL" not in held  # in the worker's file
        assert not any(s in held for s in owners) and not any(s in etl for s in owners)
        assert kept["etl"] not in held and secrets["PRIVZO_MLFLOW_WORKER_PASSWORD"] not in etl
        # the team's configuration at the system's path (a deployment from any checkout on this worker reads
        # it first): the trainer reads it, nobody but root writes it
        from flows.worker_config import SYSTEM_WORKER_CONFIG

        config = SYSTEM_WORKER_CONFIG
        assert (config.stat().st_mode & 0o777) == 0o640 and config.stat().st_uid == 0
        assert config.stat().st_gid == pwd.getpwnam("privzo-train").pw_gid and "privzo_worker:" in config.read_text()
        assert not (state / "worker.json").exists()
    assert not SYSTEM_WORKER_CONFIG.exists()  # `down` removes it


COMPOSE = ROOT / "infra" / "compose"


def _compose():
    return yaml.safe_load((COMPOSE / "compose.yaml").read_text())


def test_the_compose_stack_wires_the_worker_to_what_privzo_reads():
    """No Docker engine runs here, so infra/compose is held to the names privzo and the local Postgres
    stack use: the worker's environment, the databases, the drivers, the deployments' pool, the image."""
    from flows.record.tracking import KEY_ENV
    from specs.sections import LEDGER_URL_ENV, TRACKING_URI_ENV

    services = _compose()["services"]
    worker = services["worker"]["environment"]
    assert set(worker) == {"PREFECT_API_URL", TRACKING_URI_ENV, KEY_ENV, "PREFECT_API_AUTH_STRING",
                           "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"}
    # every service authenticated, with secrets the stack refuses to start without; PostgreSQL and Ray's
    # dashboard (its job API runs code) are not published
    assert worker["MLFLOW_TRACKING_USERNAME"] == "worker"
    for secret in (worker["PREFECT_API_AUTH_STRING"], worker["MLFLOW_TRACKING_PASSWORD"],
                   services["prefect-server"]["environment"]["PREFECT_SERVER_API_AUTH_STRING"],
                   services["mlflow-admin"]["environment"]["MLFLOW_AUTH_ADMIN_PASSWORD"],
                   services["ray-head"]["environment"]["RAY_AUTH_TOKEN"]):
        assert secret.startswith("${PRIVZO_") and ":?" in secret
    assert services["ray-head"]["environment"]["RAY_AUTH_MODE"] == "token"
    assert "ports" not in services["postgres"] and "ports" not in services["ray-head"]
    assert services["mlflow"]["command"][services["mlflow"]["command"].index("--app-name") + 1] == "privzo-auth"
    # the admin's password reaches only the command that makes the admin, never the long-running server
    assert "MLFLOW_AUTH_ADMIN_PASSWORD" not in services["mlflow"]["environment"]
    assert services["mlflow-admin"]["restart"] == "no" and "bootstrap_admin_user" in services["mlflow-admin"]["command"][-1]
    assert services["mlflow"]["depends_on"]["mlflow-admin"] == {"condition": "service_completed_successfully"}
    assert "viewer" in services["mlflow"]["environment"]["PRIVZO_MLFLOW_READ_ONLY_USERS"]
    assert worker["PREFECT_API_URL"] == "http://prefect-server:4200/api" and worker[TRACKING_URI_ENV] == "http://mlflow:5000"
    # the worker charges as the ledger's worker role, which the owner grants before the worker starts; the
    # ledger is named by the worker's configuration file, where flows/worker_config.py reads it (no job
    # variable sets a file)
    from flows.worker_config import SYSTEM_WORKER_CONFIG

    (mounted,) = services["worker"]["configs"]
    assert mounted["target"] == str(SYSTEM_WORKER_CONFIG)
    ledger = json.loads(_compose()["configs"][mounted["source"]]["content"])["ledger"]
    assert ledger.startswith("postgresql+psycopg://privzo_worker:${PRIVZO_LEDGER_WORKER_PASSWORD:?")
    assert ledger.endswith("@postgres:5432/privzo_ledger")
    assert services["ledger-grants"]["command"] == ["privzo", "budget", "grant", "privzo_worker"]
    assert services["worker"]["depends_on"]["ledger-grants"] == {"condition": "service_completed_successfully"}
    # one role per service, each owning its database; the ledger's owner is the team's, not a server's
    assert services["ledger-grants"]["environment"][LEDGER_URL_ENV].startswith(
        "postgresql+psycopg://privzo_owner:${PRIVZO_LEDGER_OWNER_PASSWORD:?")
    prefect_db = services["prefect-server"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"]
    assert prefect_db.startswith("postgresql+asyncpg://privzo_prefect:${PRIVZO_PREFECT_DB_PASSWORD:?")
    assert prefect_db.endswith("@postgres:5432/privzo_prefect")
    store = services["mlflow"]["environment"]["MLFLOW_BACKEND_STORE_URI"]  # not on its command line
    assert store.startswith("postgresql+psycopg://privzo_mlflow:${PRIVZO_MLFLOW_DB_PASSWORD:?")
    assert store.endswith("@postgres:5432/privzo_mlflow") and "--backend-store-uri" not in services["mlflow"]["command"]
    secrets = _secrets()
    made = subprocess.run(["sh", "-c", "psql() { cat; }; . ./postgres-roles.sh"], cwd=COMPOSE, capture_output=True,
                          text=True, check=True, env=dict(os.environ, POSTGRES_USER="postgres", **secrets)).stdout
    assert [line.split()[2] for line in made.splitlines() if line.startswith("CREATE DATABASE")] == \
        ["privzo_ledger", "privzo_prefect", "privzo_mlflow"]
    assert not any(s in made for s in secrets.values())  # passwords reach psql as hex only
    # the worker deploys infra/prefect.yaml and serves the pool its deployments name
    deployments = yaml.safe_load((ROOT / "infra" / "prefect.yaml").read_text())["deployments"]
    pools = {d["work_pool"]["name"] for d in deployments}
    assert pools == {"local", "etl"} and "--prefect-file infra/prefect.yaml" in services["worker"]["command"][-1]
    assert "prefect worker start --pool local" in services["worker"]["command"][-1]
    assert "for pool in local etl" in services["worker"]["command"][-1]
    # the team's rows are written from the ETL's pool only: the training worker's runs hold no writer's password
    assert {d["name"] for d in deployments if d["work_pool"]["name"] == "etl"} == {"digits-stream-team-grow"}
    # no service of privzo's runs as root (so no flow run does): each its own user, made in the image
    users = {name: service.get("user") for name, service in services.items() if name != "postgres"}
    assert users == {"prefect-server": "privzo-prefect", "mlflow": "privzo-mlflow", "mlflow-admin": "privzo-mlflow",
                     "mlflow-users": "privzo-mlflow", "ledger-grants": "privzo-owner", "worker": "privzo-train",
                     "ray-head": "privzo-train"}
    # the image holds every package pyproject installs and the working folder the deployments pull to
    dockerfile = (COMPOSE / "Dockerfile").read_text()
    for package in ("specs", "components", "flows", "infra"):
        assert f"COPY {package} {package}" in dockerfile
    assert "PRIVZO_ROOT=/opt/privzo" in dockerfile and "WORKDIR /opt/privzo" in dockerfile
    assert 'torch==2.13.0' in dockerfile  # pinned, before the project (ENVIRONMENT.md)
    assert "for role in prefect mlflow train etl owner" in dockerfile
    assert "install -d -o privzo-train -g privzo-train -m 700 /opt/privzo/.privzo" in dockerfile


def _compose_cli():
    """docker-compose, or the docker CLI's compose plugin, where one answers ``version``: a docker client
    without the plugin exits 125 on ``docker compose -f``, which says nothing about the file."""
    for cmd in (["docker-compose"], ["docker", "compose"]):
        if shutil.which(cmd[0]) is None:
            continue
        try:
            if subprocess.run([*cmd, "version"], capture_output=True, timeout=60).returncode == 0:
                return cmd
        except (OSError, subprocess.TimeoutExpired):
            continue
    return None


def test_compose_validates_the_stack_file():
    cmd = _compose_cli()
    if cmd is None:
        pytest.skip("no compose here: neither docker-compose nor docker's compose plugin answers 'version'")
    env = dict(os.environ, PRIVZO_DB_PASSWORD="x", PRIVZO_FINGERPRINT_KEY="y" * 64, PRIVZO_MLFLOW_SECRET_KEY="z",
               **_secrets())
    checked = subprocess.run([*cmd, "-f", str(COMPOSE / "compose.yaml"), "config", "-q"], env=env,
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


def test_the_compose_mlflow_command_answers_the_worker_by_its_service_name(tmp_path):
    """MLflow answers only Host headers it allows (DNS-rebinding guard): the compose file's own command,
    run here with a SQLite store, must answer `mlflow:5000`, the name the worker calls it by."""
    import time
    import urllib.error
    import urllib.request

    cmd = list(_compose()["services"]["mlflow"]["command"])
    port = _free_port()
    cmd[cmd.index("--artifacts-destination") + 1] = str(tmp_path / "artifacts")
    cmd[cmd.index("--port") + 1] = str(port)
    cmd[cmd.index("--host") + 1] = "127.0.0.1"
    cmd[0] = str(BIN / "mlflow")
    # its auth configuration, with the users' store in this test's folder instead of the /mlauth volume
    ini = (COMPOSE / "mlflow-auth.ini").read_text().replace("sqlite:////mlauth/basic_auth.db",
                                                             f"sqlite:///{tmp_path / 'auth.db'}")
    (tmp_path / "auth.ini").write_text(ini)
    server_env = dict(QUICK, **os.environ, **_compose()["services"]["mlflow"]["environment"])
    server_env.update(MLFLOW_BACKEND_STORE_URI=f"sqlite:///{tmp_path / 'mlflow.db'}",
                      MLFLOW_AUTH_CONFIG_PATH=str(tmp_path / "auth.ini"), MLFLOW_AUTH_ADMIN_PASSWORD="admin-password-1",
                      MLFLOW_FLASK_SERVER_SECRET_KEY="k" * 32)
    server = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True, env=server_env)

    def status(host):
        import base64

        request = urllib.request.Request(f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/search?max_results=1",
                                         headers={"Host": host,
                                                  "Authorization": "Basic " + base64.b64encode(b"admin:admin-password-1").decode()})
        try:
            return urllib.request.urlopen(request, timeout=30).status  # a first request waits on the app's imports
        except urllib.error.HTTPError as err:
            return err.code

    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                assert status("localhost") == 200
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError, AssertionError):
                assert time.monotonic() < deadline and server.poll() is None, "mlflow server did not start"
                time.sleep(0.5)
        assert status("mlflow:5000") == 200
        assert status("mlflow.attacker.example") != 200  # the guard is on, and the service name is allowed by it
    finally:
        os.killpg(server.pid, 15)
        server.wait(30)
