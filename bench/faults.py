"""The fault campaign: a nightly `privzo run` on real servers (a PostgreSQL ledger, an MLflow tracking server and
registry, a Prefect server), hit by one fault at one stage of its life, then the next night run, and the ledger
and registry checked. Printed as tables, fault x stage -> verdict (docs/reliability.md).

Stages, in the order a run meets them (each a hook the run's process passes, installed by this script's child
mode around privzo's own functions; privzo itself has no fault hook):
  before-reserve  the rows loaded and the plan made, before the ledger reservation
  reserved        the reservation made, before the first private step
  steps           a private step drawn uniformly from the run's steps (its sums computed, before their release)
  logging         the last step done, before the spent epsilon is logged to MLflow
  registering     before the model version is registered
  registered      the version registered, before the ledger commit
  in-commit       inside the commit's transaction, its rows written, before it commits
  committed       after the commit (what is left is the owner's verify and alias)
Faults:
  kill            SIGKILL of the run's process group (the flow-run process and all it started), at the stage
  pg-restart      PostgreSQL restarted (every connection dropped), 0-0.5 s after the stage
  pg-down         PostgreSQL stopped for --down seconds, from 0-0.5 s after the stage
  mlflow-down     the MLflow server stopped for --down seconds, then started again
  prefect-down    the Prefect server stopped for --down seconds, then started again
  disk-full       from the stage on, every write to the run's checkpoint folder fails with ENOSPC (injected at
                  the checkpoint store's writes: as root, permissions do not stop a write)

After every trial, with reservations' leases at --lease seconds, the lease is let run out and the next night
(the same spec, no fault) runs on the same dataset, whose lifetime holds one planned run and a bit more than
half of one, so the next night fits exactly when the faulted night is charged at most about half a run. Checked:
  never under-charged  every private step the faulted run began (counted by the hook, so exact) is charged:
                       its charge reserved, or committed at >= the steps begun; none aborted or absent after one
  nothing lost         every registered version's run has exactly one committed charge; no run is charged
                       twice; every committed charge's MLflow run exists
  next night runs      the next night commits, unless dp-accounting (alone, from the ledger's recorded events)
                       says it does not fit; no reservation is still open past its lease after it
  within the lifetime  the dataset's epsilon, composed by dp-accounting, is at most its lifetime

    .venv/bin/python bench/faults.py [--trials 1] [--faults kill,pg-restart,...] [--stages steps,...]
        [--down 10] [--lease 4] [--seed 0] [--out F]
Needs root (PostgreSQL is started and restarted with infra/postgres/test-db.sh and pg_ctlcluster).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("before-reserve", "reserved", "steps", "logging", "registering", "registered", "in-commit", "committed")
FAULTS = ("kill", "pg-restart", "pg-down", "mlflow-down", "prefect-down", "disk-full")
STEPS, EVERY = 200, 40


# ------------------------------------------------------------------------------------------- the run's process
def child(spec_path: str, stage: str, fault: str, control: str, target_step: int) -> int:
    """Run ``privzo run SPEC`` with a hook at ``stage``: there it writes ``arrived`` and waits for the
    controller's ``go`` (which, for a kill, never comes), or for ``disk-full`` starts failing checkpoint writes.
    It counts every private step begun into ``steps`` as it goes, so the count survives a SIGKILL."""
    import errno

    import flows.private_train as private_train
    from components.accountants.accounting import PrivacyTracker
    from flows.checkpoints import CheckpointStore
    from flows.cli import main
    from flows.ledger.core import PrivacyLedger
    from flows.session import RunSession

    folder = Path(control)
    steps_fd = os.open(folder / "steps", os.O_WRONLY | os.O_CREAT, 0o600)
    state = {"disk_full": False, "in_commit": False}

    def arrive(name: str) -> None:
        if name != stage:
            return
        (folder / "arrived").write_text(name)
        if fault == "disk-full":
            state["disk_full"] = True
            return
        deadline = time.monotonic() + 900
        while not (folder / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.02)

    def hook(owner, attr: str, before: Optional[str] = None, after: Optional[str] = None, guard=None) -> None:
        original = getattr(owner, attr)

        def hooked(*args, **kwargs):
            if before and (guard is None or guard()):
                arrive(before)
            result = original(*args, **kwargs)
            if after and (guard is None or guard()):
                arrive(after)
            return result
        setattr(owner, attr, hooked)

    reserve = RunSession.reserve

    def reserved(self, charge_id):  # the run's own charge, so the controller tells it from the next night's
        (folder / "charge").write_text(charge_id)
        return reserve(self, charge_id)
    RunSession.reserve = reserved
    hook(RunSession, "reserve", before="before-reserve", after="reserved")

    record = PrivacyTracker.record_step

    def record_step(self):
        record(self)
        os.pwrite(steps_fd, f"{self.steps:>12}\n".encode(), 0)
        if self.steps == target_step:
            arrive("steps")
    PrivacyTracker.record_step = record_step
    hook(private_train, "log_spent", before="logging")
    hook(private_train, "register", before="registering", after="registered")

    ledger_commit = PrivacyLedger.commit

    def commit(self, *args, **kwargs):
        state["in_commit"] = True
        try:
            return ledger_commit(self, *args, **kwargs)
        finally:
            state["in_commit"] = False
    PrivacyLedger.commit = commit
    hook(PrivacyLedger, "_fold", after="in-commit", guard=lambda: state["in_commit"])
    hook(RunSession, "commit", after="committed")

    def full(original):
        def write(*args, **kwargs):
            if state["disk_full"]:
                raise OSError(errno.ENOSPC, "No space left on device (injected)")
            return original(*args, **kwargs)
        return write
    CheckpointStore.save = full(CheckpointStore.save)
    CheckpointStore._write_json = full(CheckpointStore._write_json)
    return main(["run", spec_path, "--no-progress"])


# -------------------------------------------------------------------------------------------------- the stack
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer in {seconds:g} s")


class Stack:
    """PostgreSQL (a scratch schema of the test database), an MLflow server and a Prefect server, each of which
    a fault can stop and start again."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.bin = Path(sys.executable).parent
        started = subprocess.run(["bash", str(ROOT / "infra" / "postgres" / "test-db.sh"), "start"],
                                 capture_output=True, text=True, check=True)
        import sqlalchemy as sa

        self.base = started.stdout.strip().splitlines()[-1]
        self.engine = sa.create_engine(self.base, pool_pre_ping=True)  # PostgreSQL restarts under it
        self.schemas: List[str] = []
        self.pg_version = sorted(os.listdir("/usr/lib/postgresql"), key=float)[-1]
        self.mlflow_port, self.prefect_port = _free_port(), _free_port()
        self.tracking = f"http://127.0.0.1:{self.mlflow_port}"
        self.prefect_api = f"http://127.0.0.1:{self.prefect_port}/api"
        self.procs: Dict[str, subprocess.Popen] = {}
        self.start("mlflow")
        self.start("prefect")

    def new_ledger(self) -> str:
        """A ledger of its own (a scratch schema): the ledger knows the rows each dataset's runs read, so the
        same rows under another dataset's name are refused; each trial is one team's ledger."""
        import sqlalchemy as sa

        schema = f"faults{uuid.uuid4().hex[:10]}"
        with self.engine.begin() as conn:
            conn.execute(sa.text(f"CREATE SCHEMA {schema}"))
        self.schemas.append(schema)
        return f"{self.base}?options=-csearch_path%3D{schema}"

    def start(self, server: str) -> None:
        log = open(self.folder / f"{server}.log", "a")
        if server == "mlflow":
            args = [str(self.bin / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(self.mlflow_port),
                    "--backend-store-uri", f"sqlite:///{self.folder / 'mlflow.db'}",
                    "--artifacts-destination", str(self.folder / "artifacts"), "--workers", "1"]
            health = f"{self.tracking}/health"
        else:
            args = [str(self.bin / "prefect"), "server", "start", "--host", "127.0.0.1",
                    "--port", str(self.prefect_port)]
            health = f"{self.prefect_api}/health"
        env = dict(os.environ, PREFECT_HOME=str(self.folder / "prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
                   PREFECT_UI_ENABLED="false")
        self.procs[server] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                              start_new_session=True)
        _wait_http(health)

    def stop(self, server: str) -> None:
        proc = self.procs.pop(server)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)

    def pg(self, action: str) -> None:
        subprocess.run(["pg_ctlcluster", self.pg_version, "main", action], check=True, capture_output=True)
        if action != "stop":
            for _ in range(60):
                if subprocess.run(["su", "postgres", "-c", "pg_isready -q -h 127.0.0.1 -p 5432"]).returncode == 0:
                    return
                time.sleep(0.5)

    def close(self) -> None:
        import sqlalchemy as sa

        for server in list(self.procs):
            self.stop(server)
        with self.engine.begin() as conn:
            for schema in self.schemas:
                conn.execute(sa.text(f"DROP SCHEMA {schema} CASCADE"))
        self.engine.dispose()


# ------------------------------------------------------------------------------------------------- one trial
def _spec(name: str, stack: Stack, folder: Path, lifetime: float, ledger: str) -> Path:
    import yaml

    spec = {
        "name": name, "seed": 3,
        "data": {"source": {"kind": "sklearn", "name": "digits"},
                 "split": {"kind": "fraction", "public": 0.04, "test": 0.2, "imbalance": [1.0, 0.85]},
                 "declared_private_rows": 1385},
        "model": {"kind": "linear"},
        "estimator": {"kind": "two_point", "queries": 2, "smoothing": 1e-3},
        "mechanism": {"kind": "gaussian", "clip": 2.0},
        "privacy": {"epsilon": 2.0, "delta": "auto", "accountant": "rdp"},
        "sampling": {"kind": "poisson", "expected_batch_size": 64},
        "optimizer": {"kind": "sgd", "lr": 0.02, "steps": STEPS},
        "tracking": {"uri": stack.tracking, "log_every": EVERY},
        "checkpoint": {"dir": str(folder / "checkpoints")},
        "budget": {"dataset": name, "lifetime_epsilon": lifetime, "ledger": ledger},
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _run(stack: Stack, spec: Path, stage: str, fault: str, control: Path, target_step: int, lease: float,
         down: float, rng: random.Random) -> dict:
    """One run of ``spec`` with ``fault`` at ``stage`` (stage 'none': no fault); what happened to it."""
    control.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT), PREFECT_API_URL=stack.prefect_api, PRIVZO_LEASE_SECONDS=str(lease),
               PREFECT_LOGGING_LEVEL="WARNING")
    with open(control / "out.log", "w") as out:
        proc = subprocess.Popen([sys.executable, __file__, "child", str(spec), stage, fault, str(control),
                                 str(target_step)], cwd=control, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    started = time.monotonic()
    while not (control / "arrived").exists() and proc.poll() is None and time.monotonic() - started < 900:
        time.sleep(0.02)
    arrived = (control / "arrived").exists()
    killed = False
    if arrived and fault == "kill":
        os.killpg(proc.pid, signal.SIGKILL)
        killed = True
    elif arrived and fault != "disk-full":
        (control / "go").touch()
        time.sleep(rng.uniform(0, 0.5))
        if fault == "pg-restart":
            stack.pg("restart")
        elif fault == "pg-down":
            stack.pg("stop")
            time.sleep(down)
            stack.pg("start")
        elif fault in ("mlflow-down", "prefect-down"):
            server = fault.split("-")[0]
            stack.stop(server)
            time.sleep(down)
            stack.start(server)
    try:
        rc = proc.wait(max(1.0, 900 - (time.monotonic() - started)))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        rc, killed = proc.wait(30), True
    text = (control / "out.log").read_text(errors="replace")
    steps = (control / "steps").read_text().strip() if (control / "steps").exists() else ""
    charge = (control / "charge").read_text().strip() if (control / "charge").exists() else None
    last = [line for line in text.splitlines() if line.strip()][-1:] or [""]
    return {"arrived": arrived, "killed": killed, "rc": rc, "steps_begun": int(steps or 0), "charge": charge,
            "refused": "BudgetExceeded" in text or "does not fit" in text or "lifetime" in last[0],
            "last": last[0][:300], "seconds": time.monotonic() - started}


def _epsilon(events, delta: float) -> float:
    import dp_accounting

    accountant = dp_accounting.rdp.RdpAccountant()
    for event in events:
        accountant.compose(event)
    return float(accountant.get_epsilon(delta))


def _check(stack: Stack, ledger_url: str, name: str, faulted: dict, night: dict, lifetime: float,
           planned) -> tuple:
    """The invariants after a trial: ({invariant: what broke}, empty when all hold; whether dp-accounting says
    the next night fits after the faulted one)."""
    import mlflow

    from flows.ledger import PrivacyLedger

    ledger = PrivacyLedger(ledger_url)
    charges = {c.id: c for c in ledger.history(name)}
    delta = ledger.dataset(name).delta if ledger.dataset(name) is not None else None
    broke: Dict[str, List[str]] = defaultdict(list)
    for who, run in (("faulted", faulted), ("next night", night)):
        charge = charges.get(run["charge"]) if run["charge"] else None
        if run["steps_begun"] and (charge is None or charge.status == "aborted"):
            broke["under"].append(f"{who}: {run['steps_begun']} steps begun, charge {charge.status if charge else 'none'}")
        elif charge is not None and charge.status == "committed" and charge.steps_run < run["steps_begun"]:
            broke["under"].append(f"{who}: {run['steps_begun']} steps begun, {charge.steps_run} committed")
    open_after = [c for c in charges.values() if c.status == "reserved"]
    if open_after:
        broke["blocked"].append(f"{len(open_after)} reservation(s) still open after the next night")
    live = [c.event for c in charges.values() if c.status in ("reserved", "committed")]
    if delta is not None and live and _epsilon(live, delta) > lifetime * (1 + 1e-6):
        broke["lifetime"].append(f"epsilon {_epsilon(live, delta):.4f} > lifetime {lifetime:.4f}")
    night_charge = charges.get(night["charge"]) if night["charge"] else None
    night_committed = night_charge is not None and night_charge.status == "committed"
    before = [c.event for cid, c in charges.items() if c.status in ("reserved", "committed") and cid != night["charge"]]
    fits = delta is None or _epsilon(before + [planned], delta) <= lifetime
    if not night_committed:
        if fits:
            broke["blocked"].append(f"the next night did not commit though it fits ({night['last'][:160]})")
    client = mlflow.MlflowClient(stack.tracking)
    committed_by_run = defaultdict(int)
    for c in charges.values():
        if c.status == "committed" and c.run_id:
            committed_by_run[c.run_id] += 1
    for version in client.search_model_versions(f"name='{name}'"):
        if committed_by_run.get(version.run_id, 0) != 1:
            broke["lost"].append(f"version {version.version}: {committed_by_run.get(version.run_id, 0)} committed charges")
    for run_id, count in committed_by_run.items():
        if count > 1:
            broke["lost"].append(f"run {run_id} charged {count} times")
        try:
            client.get_run(run_id)
        except mlflow.exceptions.MlflowException:
            broke["lost"].append(f"charge of run {run_id}: no such MLflow run")
    return {k: "; ".join(v) for k, v in broke.items()}, fits


def _outcome(run: dict, charge) -> str:
    """What became of the faulted run, in a few words."""
    if not run["arrived"]:
        return "ended before the stage"
    how = "killed" if run["killed"] else ("finished" if run["rc"] == 0 else "failed")
    if charge is None:
        return f"{how}, no charge"
    if charge.status == "committed":
        return f"{how}, {charge.steps_run}/{charge.steps_planned} charged for {run['steps_begun']} begun"
    return f"{how}, {charge.status}"


def campaign(args) -> dict:
    import yaml

    from flows.ledger import PrivacyLedger

    rng = random.Random(args.seed)
    folder = Path(tempfile.mkdtemp(prefix="privzo-faults-"))
    stack = Stack(folder)
    results = []
    try:
        # a clean night first: the plan every trial reserves, and the figures a lifetime is set from
        plan_ledger = stack.new_ledger()
        warm = _run(stack, _spec("faults-plan", stack, folder, 100.0, plan_ledger), "none", "none", folder / "plan",
                    0, args.lease, args.down, rng)
        ledger = PrivacyLedger(plan_ledger)
        (plan,) = ledger.history("faults-plan")
        if plan.status != "committed":
            raise RuntimeError(f"the clean night did not commit: {warm['last']}")
        import dp_accounting

        planned, delta = plan.planned, ledger.dataset("faults-plan").delta
        half = dp_accounting.SelfComposedDpEvent(planned.event, planned.count * (STEPS // 2 + EVERY // 2) // STEPS)
        lifetime = float(_epsilon([planned, half], delta))
        print(f"a clean night: {warm['seconds']:.1f} s; planned epsilon {plan.planned_epsilon:.4f}; each trial's "
              f"lifetime {lifetime:.4f} (one planned run and {STEPS // 2 + EVERY // 2} of its {STEPS} steps)",
              flush=True)
        trial = 0
        for fault in args.faults:
            for stage in args.stages:
                for _ in range(args.trials):
                    trial += 1
                    name = f"faults-{trial:03d}"
                    ledger_url = stack.new_ledger()
                    spec = _spec(name, stack, folder, lifetime, ledger_url)
                    target = rng.randint(1, STEPS - 1)
                    faulted = _run(stack, spec, stage, fault, folder / name / "faulted", target, args.lease,
                                   args.down, rng)
                    time.sleep(args.lease + 1)  # its lease runs out: the next night may settle it
                    night = _run(stack, spec, "none", "none", folder / name / "night", 0, args.lease, args.down, rng)
                    broke, fits = _check(stack, ledger_url, name, faulted, night, lifetime, planned)
                    charges = {c.id: c for c in PrivacyLedger(ledger_url).history(name)}
                    row = {"fault": fault, "stage": stage, "trial": trial, "target_step": target,
                           "outcome": _outcome(faulted, charges.get(faulted["charge"])),
                           "night": ("committed" if night["charge"] and charges.get(night["charge"]) and
                                     charges[night["charge"]].status == "committed" else
                                     "refused, as it does not fit" if not fits and "lifetime_epsilon" in night["last"]
                                     else f"not committed ({night['last'][:120]})"),
                           "broke": broke, "faulted": faulted, "next_night": night}
                    results.append(row)
                    print(f"{trial:3d} {fault:12s} {stage:14s} {row['outcome']}; next night {row['night']}"
                          + (f"; BROKE {broke}" if broke else ""), flush=True)
    finally:
        stack.close()
    report = {"trials": results, "lifetime": lifetime, "lease": args.lease, "down": args.down, "folder": str(folder)}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    _table(results, args)
    return report


def _table(results: List[dict], args) -> None:
    cells = defaultdict(list)
    for row in results:
        cells[(row["fault"], row["stage"])].append(row)
    print(f"\n| fault \\ stage | {' | '.join(args.stages)} |")
    print("|---|" + "---|" * len(args.stages))
    for fault in args.faults:
        marks = []
        for stage in args.stages:
            rows = cells[(fault, stage)]
            bad = [r for r in rows if r["broke"]]
            marks.append(f"{len(rows) - len(bad)}/{len(rows)} ok" + (f" ({', '.join(sorted({k for r in bad for k in r['broke']}))})"
                                                                       if bad else ""))
        print(f"| {fault} | {' | '.join(marks)} |")
    totals = defaultdict(int)
    for row in results:
        for key in row["broke"]:
            totals[key] += 1
    print(f"\n{len(results)} trials: {totals['under']} under-charged, {totals['lost']} with a version or charge lost, "
          f"{totals['blocked']} nights blocked, {totals['lifetime']} over the lifetime")
    print("\nwhat became of the faulted run (one line a cell, the first trial's):")
    for fault in args.faults:
        for stage in args.stages:
            rows = cells[(fault, stage)]
            if rows:
                print(f"  {fault} at {stage}: {rows[0]['outcome']}; the next night {rows[0]['night']}")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["child"]:
        return child(argv[1], argv[2], argv[3], argv[4], int(argv[5]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1, help="trials per fault and stage")
    parser.add_argument("--faults", type=lambda s: s.split(","), default=list(FAULTS))
    parser.add_argument("--stages", type=lambda s: s.split(","), default=list(STAGES))
    parser.add_argument("--down", type=float, default=10.0, help="seconds a stopped server stays down")
    parser.add_argument("--lease", type=float, default=4.0, help="PRIVZO_LEASE_SECONDS of the runs")
    parser.add_argument("--seed", type=int, default=0, help="the campaign's draws (steps, timing)")
    parser.add_argument("--out", default=None, help="write every trial as JSON here")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.faults) - set(FAULTS)) + sorted(set(args.stages) - set(STAGES))
    if unknown:
        parser.error(f"unknown {', '.join(unknown)}; faults: {', '.join(FAULTS)}; stages: {', '.join(STAGES)}")
    campaign(args)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
