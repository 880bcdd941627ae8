"""A team's month on the team stack, end to end, with faults on random nights (docs/reliability.md).

The README's whole path, as the roles of the team stack (infra/local-stack.sh with PRIVZO_STACK_AUTH=1
PRIVZO_STACK_DB=postgres PRIVZO_STACK_RAY=1, every role its own OS user) meet it, for --nights simulated nights:
  01:00  the ETL's deployment digits-stream-team-grow inserts the day's rows into privzo_data's visits
  02:00  the nightly digits-stream-team-nightly reads its window (7 days) as privzo_reader, its steps on the
         stack's Ray head; every 7th night the private search digits-stream-team-tune-nightly instead
  then   the ledger's owner runs `privzo verify digits-stream-team V --promote` on the night's version
  weekly a consumer serves models:/digits-stream-team@verified with `mlflow models serve` (as the viewer) and
         scores the rows it posts: digits rows the stream only sends after the month, never trained on
Each night is a Prefect flow run scheduled at that night's time (`prefect deployment run --start-at`), which is
what its window is read as of. On --faults random nights (never the first two) one fault hits the night's
flow run at a random moment of its life (so any stage: reading, reserving, the private steps, logging,
registration, the commit):
  kill         SIGKILL of the flow-run process (and every process it started)
  pg-restart   PostgreSQL restarted (every connection of the ledger, Prefect, MLflow and the data dropped)
  mlflow-hang  the MLflow server stopped (SIGSTOP) for --hang seconds, then let go on
  ray-worker   SIGKILL of one of the run's Ray actors on the head
Reservations' leases are --lease seconds (the stack's PRIVZO_LEASE_SECONDS), so a killed night's reservation
is settled by a later night. Printed: each night's outcome, every block's (every person's: a patient belongs to
the day of their first visit) epsilon from dp-accounting alone, from the charges' recorded events, against the
ledger's claim and the lifetime, what the served model scores each week, and the invariants of
bench/faults.py (never under-charged, nothing lost, the next night runs, within the lifetime).

    .venv/bin/python bench/month.py [--nights 30] [--faults 6] [--kinds kill,...] [--seed 0] [--lease 60]
        [--hang 20] [--out F]
Needs root (the team stack drops to an OS user per role) and PostgreSQL (infra/postgres/test-db.sh), and
starts from an empty team: the stack's databases and roles are dropped first (refused while a stack runs).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
STATE = ROOT / ".privzo-stack"
DATASET = MODEL = "digits-stream-team"
PG_HOST = "127.0.0.1:5432"
ROLES = ("privzo_owner", "privzo_worker", "privzo_prefect", "privzo_mlflow", "privzo_etl", "privzo_reader")
DATABASES = ("privzo_ledger", "privzo_prefect", "privzo_mlflow", "privzo_data")
FAULTS = ("kill", "pg-restart", "mlflow-hang", "ray-worker")
GROW, NIGHTLY, SEARCH = ("grow-stream/digits-stream-team-grow", "private-train/digits-stream-team-nightly",
                         "private-tune/digits-stream-team-tune-nightly")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _secrets() -> Dict[str, str]:
    return {"PRIVZO_PREFECT_AUTH_STRING": f"admin:{secrets.token_hex(12)}",
            "PRIVZO_MLFLOW_ADMIN_PASSWORD": secrets.token_hex(12), "PRIVZO_MLFLOW_WORKER_PASSWORD": secrets.token_hex(12),
            "PRIVZO_MLFLOW_VIEWER_PASSWORD": secrets.token_hex(12), "PRIVZO_RAY_TOKEN": secrets.token_hex(32),
            "PRIVZO_LEDGER_WORKER_PASSWORD": secrets.token_hex(12), "PRIVZO_LEDGER_OWNER_PASSWORD": secrets.token_hex(12),
            "PRIVZO_PREFECT_DB_PASSWORD": secrets.token_hex(12), "PRIVZO_MLFLOW_DB_PASSWORD": secrets.token_hex(12)}


# --------------------------------------------------------------------------------------------------- the stack
class TeamStack:
    """The team stack on free ports, from empty databases; the owner's, the admin's and the viewer's credentials
    are this script's, as they are the operator's."""

    def __init__(self, folder: Path, lease: float):
        self.folder = folder
        if os.geteuid() != 0:
            raise SystemExit("month: the team stack starts as root (it drops to an OS user per role)")
        for pid_file in STATE.glob("*.pid"):
            with contextlib.suppress(ValueError, ProcessLookupError):
                os.killpg(int(pid_file.read_text().strip()), 0)
                raise SystemExit(f"month: a stack is running from {STATE}; stop it first (make down)")
        shutil.rmtree(STATE, ignore_errors=True)  # a stopped stack's users and passwords are not this month's
        subprocess.run(["bash", str(ROOT / "infra" / "postgres" / "test-db.sh"), "start"], check=True,
                       capture_output=True, text=True, timeout=600)
        sql = [f"DROP DATABASE IF EXISTS {d} WITH (FORCE)" for d in DATABASES] + [f"DROP ROLE IF EXISTS {r}" for r in ROLES]
        subprocess.run(["su", "postgres", "-c", "psql -q " + " ".join(f"-c '{q}'" for q in sql)], check=True,
                       capture_output=True, timeout=120)
        self.pg_version = sorted(os.listdir("/usr/lib/postgresql"), key=float)[-1]
        self.secrets = _secrets()
        env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI",
                                                                 "PRIVZO_LEDGER_URL")}
        env.update(self.secrets, MLFLOW_WORKERS="1", PREFECT_WORKER_QUERY_SECONDS="1", PRIVZO_STACK_DB="postgres",
                   PRIVZO_STACK_AUTH="1", PRIVZO_STACK_RAY="1", PRIVZO_LEASE_SECONDS=f"{lease:g}",
                   PRIVZO_PREFECT_PORT=str(_free_port()), PRIVZO_MLFLOW_PORT=str(_free_port()),
                   PRIVZO_RAY_PORT=str(_free_port()), PRIVZO_RAY_DASHBOARD_PORT=str(_free_port()),
                   PREFECT_HOME=str(folder / "prefect-home"))
        self.env = env
        up = subprocess.run(["bash", str(ROOT / "infra" / "local-stack.sh"), "up"], env=env, capture_output=True,
                            text=True, timeout=600, cwd=ROOT)
        if up.returncode != 0:
            self.down()
            raise RuntimeError(f"local-stack.sh up failed: {up.stderr[-2000:]}")
        self.tracking = f"http://127.0.0.1:{env['PRIVZO_MLFLOW_PORT']}"
        self.prefect = dict(env, PREFECT_API_URL=f"http://127.0.0.1:{env['PRIVZO_PREFECT_PORT']}/api",
                            PREFECT_API_AUTH_STRING=self.secrets["PRIVZO_PREFECT_AUTH_STRING"])
        self.owner_url = f"postgresql+psycopg://privzo_owner@{PG_HOST}/privzo_ledger"
        # the owner's passwords in a libpq password file of their own, not PGPASSWORD: verify reads a SQL
        # source's rows as its reading role, and PGPASSWORD would be sent for that role too
        host, port = PG_HOST.split(":")
        self.pgpass = folder / "owner-pgpass"
        self.pgpass.write_text(f"{host}:{port}:privzo_ledger:privzo_owner:{self.secrets['PRIVZO_LEDGER_OWNER_PASSWORD']}\n"
                               f"{host}:{port}:privzo_data:privzo_reader:"
                               f"{(STATE / 'reader-db-password').read_text().strip()}\n")
        self.pgpass.chmod(0o600)
        # the owner's commands: the ledger's owner, and MLflow's admin (the promoter who moves @verified)
        self.owner = dict(os.environ, PRIVZO_LEDGER_URL=self.owner_url, PGPASSFILE=str(self.pgpass),
                          MLFLOW_TRACKING_URI=self.tracking,
                          MLFLOW_TRACKING_USERNAME="admin",
                          MLFLOW_TRACKING_PASSWORD=self.secrets["PRIVZO_MLFLOW_ADMIN_PASSWORD"])
        self.viewer = dict(os.environ, MLFLOW_TRACKING_URI=self.tracking, MLFLOW_TRACKING_USERNAME="viewer",
                           MLFLOW_TRACKING_PASSWORD=self.secrets["PRIVZO_MLFLOW_VIEWER_PASSWORD"],
                           PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")

    def down(self) -> None:
        subprocess.run(["bash", str(ROOT / "infra" / "local-stack.sh"), "down"], env=self.env, capture_output=True,
                       timeout=180, cwd=ROOT)
        logs = self.folder / "stack-logs"
        logs.mkdir(exist_ok=True)
        for log in STATE.glob("*.log"):
            shutil.copyfile(log, logs / log.name)
        shutil.rmtree(STATE, ignore_errors=True)

    def privzo(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "privzo"), *args], env=self.owner, capture_output=True, text=True,
                              timeout=600, cwd=ROOT)

    def ledger(self):
        os.environ["PGPASSFILE"] = str(self.pgpass)
        from flows.ledger import PrivacyLedger

        return PrivacyLedger(self.owner_url)

    def pid(self, name: str) -> int:
        return int((STATE / f"{name}.pid").read_text().strip())


def flow_run_processes() -> List[int]:
    """The processes of the flow run in progress (one at a time here): those whose environment names a flow run,
    and what they started."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):
            if b"PREFECT__FLOW_RUN_ID=" in environ.read_bytes():
                found.append(int(environ.parent.name))
    return found


def ray_actors() -> List[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if cmdline.read_bytes().startswith(b"ray::ReplicaWorker"):
                found.append(int(cmdline.parent.name))
    return found


def inject(stack: TeamStack, fault: str, delay: float, hang: float, said: dict) -> None:
    """``fault`` at ``delay`` seconds into the flow run's life (counted from when its process appears)."""
    deadline = time.monotonic() + 300
    while not flow_run_processes():
        if time.monotonic() > deadline:
            said["fault"] = "no flow run appeared"
            return
        time.sleep(0.2)
    time.sleep(delay)
    if fault == "kill":
        pids = flow_run_processes()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        said["fault"] = f"killed {len(pids)} process(es) at {delay:.1f} s"
    elif fault == "pg-restart":
        subprocess.run(["pg_ctlcluster", stack.pg_version, "main", "restart"], check=True, capture_output=True)
        said["fault"] = f"PostgreSQL restarted at {delay:.1f} s"
    elif fault == "mlflow-hang":
        group = stack.pid("mlflow")
        os.killpg(group, signal.SIGSTOP)
        time.sleep(hang)
        os.killpg(group, signal.SIGCONT)
        said["fault"] = f"MLflow stopped {hang:g} s from {delay:.1f} s"
    elif fault == "ray-worker":
        actors = ray_actors()
        if actors:
            os.kill(actors[0], signal.SIGKILL)
        said["fault"] = f"{'a Ray actor killed' if actors else 'no Ray actor alive'} at {delay:.1f} s"


def deployment_run(stack: TeamStack, name: str, at: dt.datetime) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "prefect"), "deployment", "run", name, "--start-at",
                           at.strftime("%Y-%m-%d %H:%M:%S"), "--watch", "--watch-timeout", "900"],
                          env=stack.prefect, capture_output=True, text=True, timeout=1000, cwd=ROOT)


# ---------------------------------------------------------------------------------------------- the consumer
def consumer_rows(nights: int):
    """Digits rows the stream sends only after the month (so no night trained on them), as the table stores them:
    px0..px63 and the label."""
    from flows.simulate import PER_DAY, RETURN_AFTER, stream_frame

    frame = stream_frame(dt.datetime(2100, 1, 1, tzinfo=dt.timezone.utc), start=dt.date(2000, 1, 1),
                         with_visits=True)
    after = PER_DAY * (nights + 8 + RETURN_AFTER + 2)
    frame = frame[frame["visit"] >= after]
    return frame[[f"px{i}" for i in range(64)]], frame["digit"].astype(str).tolist()


def served_accuracy(stack: TeamStack, rows, labels, folder: Path) -> Optional[float]:
    """``mlflow models serve -m models:/NAME@verified`` as the viewer, the rows posted as dataframe_split."""
    port = _free_port()
    server = subprocess.Popen([str(BIN / "mlflow"), "models", "serve", "-m", f"models:/{MODEL}@verified",
                               "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)], cwd=folder,
                              env=stack.viewer, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    print(f"  serve failed: {(server.stderr.read() if server.poll() is not None else 'no /ping')[-400:]}")
                    return None
                time.sleep(0.5)
        body = json.dumps({"dataframe_split": json.loads(rows.to_json(orient="split", index=False))}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as answer:
            predictions = json.loads(answer.read())["predictions"]
        return sum(p["label"] == y for p, y in zip(predictions, labels)) / len(labels)
    finally:
        server.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=30)


# ------------------------------------------------------------------------------------------------ the checks
def _epsilon(events, delta: float) -> float:
    import dp_accounting

    accountant = dp_accounting.rdp.RdpAccountant()
    for event in events:
        accountant.compose(event)
    return float(accountant.get_epsilon(delta))


def blocks_table(ledger) -> List[dict]:
    """Every block: its charges, its epsilon from dp-accounting alone (the charges' recorded events, reserved
    or committed), the ledger's claim and the lifetime."""
    terms = ledger.dataset(DATASET)
    by_block = defaultdict(list)
    for charge in ledger.history(DATASET):
        if charge.status in ("reserved", "committed"):
            for block in charge.blocks:
                by_block[block].append(charge.event)
    claimed = {b.block: b.epsilon for b in ledger.blocks(DATASET)}
    return [{"block": block, "charges": len(events), "epsilon": _epsilon(events, terms.delta),
             "claimed": float(claimed.get(block, float("nan"))), "lifetime": terms.lifetime_epsilon}
            for block, events in sorted(by_block.items())]


def invariants(stack: TeamStack, nights: List[dict]) -> Dict[str, List[str]]:
    import mlflow

    ledger = stack.ledger()
    charges = ledger.history(DATASET)
    broke: Dict[str, List[str]] = defaultdict(list)
    client = mlflow.MlflowClient(stack.tracking)
    os.environ.update(MLFLOW_TRACKING_USERNAME="admin", MLFLOW_TRACKING_PASSWORD=stack.owner["MLFLOW_TRACKING_PASSWORD"])
    # never under-charged: a charge settled below the steps its MLflow run logged, or released after any
    for c in charges:
        if not c.run_id:
            continue
        with contextlib.suppress(mlflow.exceptions.MlflowException):
            logged = max((m.step for m in client.get_metric_history(c.run_id, "privacy/epsilon")), default=0)
            if c.status == "aborted" and logged > 0:
                broke["under"].append(f"charge {c.id}: released though its run logged step {logged}")
            if c.status == "committed" and c.steps_run < logged:
                broke["under"].append(f"charge {c.id}: {c.steps_run} steps committed, step {logged} logged")
    committed_by_run = defaultdict(int)
    for c in charges:
        if c.status == "committed" and c.run_id:
            committed_by_run[c.run_id] += 1
    for version in client.search_model_versions(f"name='{MODEL}'"):
        if committed_by_run.get(version.run_id, 0) != 1:
            broke["lost"].append(f"version {version.version}: {committed_by_run.get(version.run_id, 0)} committed charges")
    for run_id, count in committed_by_run.items():
        if count > 1:
            broke["lost"].append(f"run {run_id} charged {count} times")
        try:
            client.get_run(run_id)
        except mlflow.exceptions.MlflowException:
            broke["lost"].append(f"charge of run {run_id}: no such MLflow run")
    for before, night in zip(nights, nights[1:]):
        if before.get("fault") and night["outcome"] != "committed":
            broke["blocked"].append(f"night {night['night']} after a faulted night: {night['outcome']}")
    for c in charges:  # after the month its lease has run out and the owner has settled the dataset
        if c.status == "reserved":
            broke["blocked"].append(f"charge {c.id} still reserved past its lease")
    for row in blocks_table(ledger):
        if row["epsilon"] > row["lifetime"] * (1 + 1e-6):
            broke["lifetime"].append(f"block {row['block']}: {row['epsilon']:.4f} > {row['lifetime']}")
        if abs(row["epsilon"] - row["claimed"]) > 1e-6 * max(1.0, row["epsilon"]):
            broke["claim"].append(f"block {row['block']}: dp-accounting {row['epsilon']:.6f}, ledger {row['claimed']:.6f}")
    return broke


# --------------------------------------------------------------------------------------------------- the month
def month(args) -> dict:
    rng = random.Random(args.seed)
    folder = Path(tempfile.mkdtemp(prefix="privzo-month-"))
    folder.chmod(0o755)
    # every kind once before any twice, on nights drawn at random (never the first two: a window to train on)
    kinds = [kind for _ in range(-(-args.faults // len(args.kinds))) for kind in rng.sample(args.kinds, len(args.kinds))]
    fault_nights = dict(zip(sorted(rng.sample(range(2, args.nights), min(args.faults, max(0, args.nights - 2)))),
                            kinds[:args.faults]))
    first = dt.datetime.now(dt.timezone.utc).date() - dt.timedelta(days=args.nights)
    rows, labels = consumer_rows(args.nights)
    began = time.monotonic()
    stack = TeamStack(folder, args.lease)
    nights: List[dict] = []
    weeks: List[dict] = []
    try:
        init = stack.privzo("budget", "init", DATASET, "--spec", "infra/stack/digits_stream_team.yaml")
        if init.returncode != 0:
            raise RuntimeError(f"budget init: {init.stderr.strip()[-500:]}")
        print(f"the stack up and {DATASET} registered in {time.monotonic() - began:.0f} s; nights from {first}, "
              f"faults on {fault_nights}", flush=True)
        typical, delta = 30.0, stack.ledger().dataset(DATASET).delta
        for night in range(args.nights):
            day = first + dt.timedelta(days=night)
            at = dt.datetime.combine(day, dt.time(2, 0))
            row: dict = {"night": night + 1, "date": day.isoformat()}
            grown = deployment_run(stack, GROW, at - dt.timedelta(hours=1))
            row["grow"] = "ok" if grown.returncode == 0 and "Completed" in grown.stdout else "failed"
            deployment = SEARCH if (night + 1) % 7 == 0 else NIGHTLY
            row["kind"] = "search" if deployment == SEARCH else "retrain"
            said: dict = {}
            injector = None
            if night in fault_nights:
                row["fault"] = fault_nights[night]
                injector = threading.Thread(target=inject, args=(stack, row["fault"], rng.uniform(0, typical),
                                                                 args.hang, said))
                injector.start()
            ledger = stack.ledger()
            known = {c.id for c in ledger.history(DATASET)}
            started = time.monotonic()
            ran = deployment_run(stack, deployment, at)
            row["seconds"] = round(time.monotonic() - started, 1)
            if injector is not None:
                injector.join()
                row["fault_said"] = said.get("fault")
            new = [c for c in stack.ledger().history(DATASET) if c.id not in known]
            committed = [c for c in new if c.status == "committed"]
            row["outcome"] = "committed" if committed else (
                f"{new[-1].status} ({new[-1].steps_run} steps)" if new else "no charge") + \
                ("" if ran.returncode == 0 else f"; {_last_line(ran)}")
            if committed and ran.returncode == 0 and not row.get("fault"):
                typical = row["seconds"]
            row["epsilon"] = round(_epsilon([committed[0].event], delta), 4) if committed else None
            version = _version_of(stack, committed[0].run_id) if committed else None
            if version is not None:
                checked = stack.privzo("verify", MODEL, str(version), "--promote")
                row["verify"] = "promoted" if checked.returncode == 0 else f"FAILED: {checked.stdout.splitlines()[:1]}"
                row["version"] = version
            nights.append(row)
            print(f"night {night + 1:2d} {day} {row['kind']:7s} {row['seconds']:6.1f} s  {row['outcome']}"
                  + (f"  v{version} {row.get('verify')}" if version is not None else "")
                  + (f"  [{row['fault']}: {row.get('fault_said')}]" if row.get("fault") else ""), flush=True)
            if (night + 1) % 7 == 0 or night + 1 == args.nights:
                accuracy = served_accuracy(stack, rows, labels, folder)
                weeks.append({"after_night": night + 1, "accuracy": accuracy, "rows": len(labels)})
                print(f"  the consumer's models:/{MODEL}@verified scores "
                      f"{'—' if accuracy is None else f'{accuracy:.3f}'} on {len(labels)} rows", flush=True)
        time.sleep(args.lease + 1)
        settled = stack.privzo("budget", "settle", DATASET)  # the runbook's: what died is settled at its bound
        print(settled.stdout.strip()[-600:], flush=True)
        broke = invariants(stack, nights)
        blocks = blocks_table(stack.ledger())
    finally:
        stack.down()
    report = {"nights": nights, "weeks": weeks, "blocks": blocks, "broke": {k: v for k, v in broke.items()},
              "faults": {str(k + 1): v for k, v in fault_nights.items()}, "lease": args.lease,
              "wall_s": round(time.monotonic() - began)}
    _print(report, args)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    return report


def _last_line(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    return lines[-1][:160] if lines else f"rc {done.returncode}"


def _version_of(stack: TeamStack, run_id: str) -> Optional[int]:
    import mlflow

    os.environ.update(MLFLOW_TRACKING_USERNAME="admin", MLFLOW_TRACKING_PASSWORD=stack.owner["MLFLOW_TRACKING_PASSWORD"])
    found = mlflow.MlflowClient(stack.tracking).search_model_versions(f"name='{MODEL}' and run_id='{run_id}'")
    return int(found[0].version) if found else None


def _print(report: dict, args) -> None:
    nights = report["nights"]
    committed = sum(n["outcome"] == "committed" for n in nights)
    print(f"\n{committed} of {len(nights)} nights committed ({sum(1 for n in nights if n.get('fault'))} faulted; "
          f"lease {args.lease:g} s); wall {report['wall_s']} s")
    print("| block | charges | ε, dp-accounting | ε, ledger | lifetime |\n|---|---|---|---|---|")
    for row in report["blocks"]:
        print(f"| {row['block']} | {row['charges']} | {row['epsilon']:.4f} | {row['claimed']:.4f} | {row['lifetime']:g} |")
    print("| week (after night) | the consumer's served @verified accuracy |\n|---|---|")
    for week in report["weeks"]:
        shown = "—" if week["accuracy"] is None else f"{week['accuracy']:.3f}"
        print(f"| {week['after_night']} | {shown} |")
    for name in ("under", "lost", "blocked", "lifetime", "claim"):
        print(f"{name}: {'; '.join(report['broke'].get(name, [])) or 'held'}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nights", type=int, default=30)
    parser.add_argument("--faults", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lease", type=float, default=60.0)
    parser.add_argument("--hang", type=float, default=20.0)
    parser.add_argument("--kinds", default=",".join(FAULTS), help=f"the faults drawn from (of {', '.join(FAULTS)})")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: the stack still goes down (finally)
    args.kinds = [k for k in args.kinds.split(",") if k]
    unknown = sorted(set(args.kinds) - set(FAULTS))
    if unknown or not args.kinds:
        parser.error(f"--kinds: {', '.join(unknown) or 'none given'}; allowed: {', '.join(FAULTS)}")
    report = month(args)
    return 1 if report["broke"] else 0


if __name__ == "__main__":
    sys.exit(main())
