"""privzo on a real multi-node Ray cluster: a head and two worker nodes, each its own ``ray start`` on a host
of its own (a network namespace, or a loopback address where namespaces cannot be made), and a driver on a
fourth host that joins through Ray Client (``execution.address: ray://HEAD:10001``).

Shown here: the same parameters as the local backend; workers spread across nodes, or so many per node;
a worker node that cannot read the data, or holds other rows, refused in one line; a worker node killed
mid-run (the same trajectory and epsilon, one ledger charge, one MLflow run); and the head lost mid-run
(a one-line end, then ``--resume latest`` once the cluster is back).
"""
import copy
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

import specs
from components import builders
from tests.conftest import fixed_loop
from flows.record.tracking_names import DP_EPSILON

pytestmark = [pytest.mark.e2e, pytest.mark.serial]
ROOT = Path(__file__).resolve().parents[2]
# the failures these tests cause are noticed in seconds, not Ray's defaults: the same paths, sooner. A node
# is declared dead after 5 missed 1 s health checks (Ray: 5 of 3 s), which a node starved of the CPU for a
# moment by the rest of the suite (`make test` runs it alongside) does not miss; the driver of the head-loss
# test gives up on the lost head after 5 s (Ray Client: 30 s)
FAST_FAILURE = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "5"}
FAST_GIVE_UP = {"RAY_CLIENT_RECONNECT_GRACE_PERIOD": "5"}


def _cluster_module():
    spec = importlib.util.spec_from_file_location("privzo_ray_cluster", ROOT / "infra" / "ray" / "cluster.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    module = _cluster_module()
    state = tmp_path_factory.mktemp("ray-cluster")
    # PRIVZO_CLUSTER_MODE=loopback runs the loopback mode where namespaces could be made too
    made = module.LocalCluster(state, workers=2, cpus_per_node=2, mode=os.environ.get("PRIVZO_CLUSTER_MODE", "auto"),
                               env=FAST_FAILURE)
    try:
        made.up()
    except Exception as err:  # noqa: BLE001 - say why, then stop what was started
        pytest.fail(f"the test cluster did not start: {err}")
    print(f"\ntest cluster mode: {made.mode} (head {made.gcs_address}, driver {made.driver_ip})")
    yield made
    made.down()


def _spec(tiny, cluster, **execution) -> dict:
    d = copy.deepcopy(tiny)
    d["execution"] = {"backend": "ray", "workers": 2, "address": cluster.client_address, **execution}
    return d


def _local_reference(d: dict, steps: int):
    d = copy.deepcopy(d)
    d["execution"] = {"backend": "local"}
    built = fixed_loop(d)
    built.loop.run(steps)
    return torch.cat([p.detach().flatten() for p in built.model.parameters()]), built.loop.tracker.epsilon()


def _driver(cluster, d: dict, tmp_path: Path, steps: int, pause_at=None, prefix=()):
    """Start tests/cluster/driver.py on the driver host; returns (process, where it saves its result)."""
    spec_path, out = tmp_path / "spec.json", tmp_path / "out.pt"
    spec_path.write_text(json.dumps(d))
    argv = [*prefix, sys.executable, "-m", "tests.cluster.driver", str(spec_path), str(out), "--steps", str(steps)]
    if pause_at is not None:
        argv += ["--pause-at", str(pause_at)]
    proc = subprocess.Popen(cluster.driver_argv(argv), cwd=ROOT, env=cluster.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    return proc, out


def _finish(proc, timeout=400) -> str:
    output, _ = proc.communicate(timeout=timeout)
    return output


def _worker_ips(cluster):
    return {node["ip"] for node in cluster.info["nodes"][1:]}


def test_parameters_after_n_steps_equal_the_local_backends(cluster, tiny_spec_dict, tmp_path):
    """Across nodes, as on one: every other estimator's Ray backend is held to the local one on a single node
    (tests/components/test_ray_backend.py); here the multi-node placement."""
    d = _spec(tiny_spec_dict, cluster)
    proc, out = _driver(cluster, d, tmp_path, steps=20)
    expected, epsilon = _local_reference(d, 20)
    output = _finish(proc)
    assert proc.returncode == 0, output[-3000:]
    result = torch.load(out)
    assert float((result["params"] - expected).abs().max()) <= 1e-6
    assert result["epsilon"] == epsilon
    # spread by the placement group: one worker on each worker node (the head offers no CPU)
    assert sorted(result["placed"]) == sorted(_worker_ips(cluster))


def test_workers_per_node_places_whole_nodes_and_refuses_what_the_cluster_cannot_hold(cluster, tiny_spec_dict,
                                                                                      tmp_path):
    d = _spec(tiny_spec_dict, cluster, workers=4, workers_per_node=2)
    proc, out = _driver(cluster, d, tmp_path, steps=3)
    output = _finish(proc)
    assert proc.returncode == 0, output[-3000:]
    placed = torch.load(out)["placed"]
    assert sorted(placed) == sorted(2 * list(_worker_ips(cluster)))
    assert placed[0] == placed[1] and placed[2] == placed[3]  # worker i in bundle i // 2

    d = _spec(tiny_spec_dict, cluster, workers=3, workers_per_node=1)  # three nodes with a CPU: there are two
    proc, _ = _driver(cluster, d, tmp_path, steps=3)
    output = _finish(proc)
    assert proc.returncode != 0
    assert (f"PlacementError: execution: the Ray cluster at {cluster.client_address} cannot place 3 workers "
            "(1 a node on 3 nodes, 1 CPU a bundle): its 3 alive nodes have room for 2 bundles") in output


def test_a_worker_node_that_cannot_read_the_data_or_holds_other_rows_is_refused(cluster, tiny_spec_dict, tmp_path):
    """The driver's host has the file on a disk of its own (a mount namespace); the worker hosts do not, and
    then hold another file at that path. Each start is refused in one line naming the node."""
    if cluster.mode != "netns":
        pytest.skip("needs a mount namespace for the driver's own disk, made with the network namespaces")
    from tests.conftest import write_digits_file

    disk = tmp_path / "disk"
    disk.mkdir()
    own = write_digits_file(tmp_path / "driver-copy.csv", rows=range(1500))
    d = _spec(tiny_spec_dict, cluster)
    d["data"] = {"declared_private_rows": 1000, "split": {"kind": "hashed", "public": 0.04, "test": 0.2},
                 "source": {"kind": "file", "path": str(disk / "rows.csv"), "label": "digit",
                            "classes": list(range(10))}}
    # on the driver's host only: a disk mounted over the folder, holding the rows
    private_disk = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                    f'mount -t tmpfs none "{disk}" && cp "{own}" "{disk}/rows.csv" && exec "$0" "$@"']
    proc, _ = _driver(cluster, d, tmp_path, steps=3, prefix=private_disk)
    output = _finish(proc)
    assert proc.returncode != 0
    assert "DataUnreadable: data.source: the Ray worker on node 10.77.0." in output
    assert "cannot read the private rows (ValueError: data.source.path: " in output

    write_digits_file(disk / "rows.csv", rows=range(1400))  # the worker hosts' copy: other rows
    proc, _ = _driver(cluster, d, tmp_path, steps=3, prefix=private_disk)
    output = _finish(proc)
    assert proc.returncode != 0
    assert "DataChanged: data.source: a Ray worker loaded different private or public rows than the driver (on node " \
           "10.77.0." in output


def test_a_killed_worker_node_leaves_the_trajectory_and_epsilon_unchanged(cluster, tiny_spec_dict, tmp_path):
    d = _spec(tiny_spec_dict, cluster)
    proc, out = _driver(cluster, d, tmp_path, steps=40, pause_at=10)
    expected, epsilon = _local_reference(d, 40)
    deadline = time.monotonic() + 300
    while not Path(f"{out}.paused").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
        time.sleep(0.2)
    placed = json.loads(Path(f"{out}.paused").read_text())
    victim = next(k for k, node in enumerate(cluster.info["nodes"]) if node["ip"] == placed[0])
    cluster.kill_node(victim)  # ray start, its raylet, object store and the worker on it
    Path(f"{out}.go").write_text("")
    output = _finish(proc)
    try:
        assert proc.returncode == 0, output[-3000:]
        result = torch.load(out)
        assert result["restarts"] == 1 and placed[0] not in result["nodes"]
        assert result["steps"] == 40 and result["epsilon"] == epsilon
        assert float((result["params"] - expected).abs().max()) <= 1e-6
    finally:
        cluster.start_node(victim)
        cluster.wait_for_nodes(3)


def _run_on_driver(cluster, tmp_path: Path, *args: str, env=None):
    return subprocess.Popen(cluster.driver_argv([sys.executable, "-m", "flows.cli", "run", *args, "--no-progress"]),
                            cwd=tmp_path, env={**cluster.env(), "PYTHONPATH": str(ROOT), **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


# long enough that the node dies at step 40 with most of the run still to go over Ray Client
FLOW_STEPS = 200


def _flow_spec(tiny, cluster, tmp_path: Path) -> Path:
    d = _spec(tiny, cluster)
    d["optimizer"]["steps"] = FLOW_STEPS
    d["tracking"] = {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "log_every": 20}
    d["checkpoint"] = {"dir": str(tmp_path / "checkpoints"), "keep": True}
    d["budget"] = {"dataset": "digits-patients", "lifetime_epsilon": 5.0, "ledger": f"sqlite:///{tmp_path / 'ledger.db'}"}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


def _when_checkpointed(proc, tmp_path: Path, step: int) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        for found in (tmp_path / "checkpoints").glob("*/*/checkpoint.pt"):
            try:
                if torch.load(found, weights_only=True)["loop"]["step"] >= step:
                    return
            except (EOFError, RuntimeError, FileNotFoundError):
                pass
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        time.sleep(0.1)
    raise AssertionError("no checkpoint appeared")


def _one_charge_one_run(tmp_path: Path):
    """The ledger holds one committed charge of the whole run, whose epsilon is the planned one; MLflow
    holds one finished run."""
    import mlflow

    from flows.ledger import PrivacyLedger

    spec = specs.load_spec(tmp_path / "spec.yaml")
    _, _, planned_epsilon = builders.resolve_privacy(spec)

    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'ledger.db'}")
    (charge,) = ledger.history("digits-patients")
    assert charge.status == "committed" and charge.steps_run == FLOW_STEPS
    assert ledger.spent("digits-patients") == pytest.approx(planned_epsilon, rel=1e-9)
    (run,) = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").search_runs(
        [e.experiment_id for e in mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").search_experiments()])
    assert run.info.status == "FINISHED" and run.info.run_id == charge.run_id
    # the tag is shown to 6 significant digits: 1.9999976 is "2"
    assert float(run.data.tags[DP_EPSILON]) == pytest.approx(planned_epsilon, rel=5e-6)


def test_a_worker_node_killed_during_a_flow_run_costs_one_charge_and_one_run(cluster, tiny_spec_dict, tmp_path):
    path = _flow_spec(tiny_spec_dict, cluster, tmp_path)
    proc = _run_on_driver(cluster, tmp_path, str(path))
    _when_checkpointed(proc, tmp_path, 40)
    cluster.kill_node(2)
    output = _finish(proc)
    try:
        assert proc.returncode == 0, output[-3000:]
        _one_charge_one_run(tmp_path)
    finally:
        cluster.start_node(2)
        cluster.wait_for_nodes(3)


def test_losing_the_head_ends_the_run_in_one_line_and_it_resumes_once_the_cluster_is_back(cluster, tiny_spec_dict,
                                                                                            tmp_path):
    path = _flow_spec(tiny_spec_dict, cluster, tmp_path)
    proc = _run_on_driver(cluster, tmp_path, str(path), env=FAST_GIVE_UP)
    _when_checkpointed(proc, tmp_path, 40)
    cluster.kill_node(0)
    output = _finish(proc)
    assert proc.returncode == 2, output[-3000:]
    (line,) = [line for line in output.splitlines() if line.startswith("privzo: error:")]
    assert line.startswith(f"privzo: error: execution.address: lost the Ray cluster at {cluster.client_address} (")
    assert re.search(r"; no value was released for the step in flight; once the cluster is back, resume the run: "
                     rf"\S*privzo run {re.escape(str(path))} --resume latest$", line), line

    cluster.down()
    cluster.up()  # the same addresses, a new token
    resumed = _run_on_driver(cluster, tmp_path, str(path), "--resume", "latest")
    output = _finish(resumed)
    assert resumed.returncode == 0, output[-3000:]
    assert "resuming tiny-digits from its checkpoint at step" in output
    _one_charge_one_run(tmp_path)


def test_a_person_level_night_on_blocks_survives_a_killed_worker_node_and_commits_once(cluster, tmp_path):
    """A night on blocks at person level on the cluster: its workers read the window's rows themselves (each
    person's rows on one worker) and match the driver's digest; a worker node killed mid-run costs nothing:
    one committed charge, one MLflow run, and the ledger's blocks equal the same night run locally."""
    import mlflow

    from flows.ledger import PrivacyLedger
    from tests.flows.test_blocks import night, stream_spec, write_stream

    write_stream(tmp_path / "visits.csv", days=4, persons=True)
    as_of = night(2).isoformat()
    runs = {}
    for where in ("cluster", "local"):
        folder = tmp_path / where
        folder.mkdir()
        d = stream_spec(tmp_path, window=2, persons=True)
        d["optimizer"]["steps"] = FLOW_STEPS
        d["tracking"] = {"uri": f"sqlite:///{folder / 'mlflow.db'}", "log_every": 20}
        d["checkpoint"] = {"dir": str(folder / "checkpoints"), "keep": True}
        d["budget"]["ledger"] = f"sqlite:///{folder / 'ledger.db'}"
        d["execution"] = {"backend": "ray", "workers": 2, "address": cluster.client_address} \
            if where == "cluster" else {"backend": "local"}
        (folder / "spec.yaml").write_text(yaml.safe_dump(d))
        runs[where] = folder
    proc = _run_on_driver(cluster, runs["cluster"], str(runs["cluster"] / "spec.yaml"), "--as-of", as_of)
    _when_checkpointed(proc, runs["cluster"], 40)
    cluster.kill_node(2)
    output = _finish(proc)
    try:
        assert proc.returncode == 0, output[-3000:]
    finally:
        cluster.start_node(2)
        cluster.wait_for_nodes(3)
    here = subprocess.run([sys.executable, "-m", "flows.cli", "run", str(runs["local"] / "spec.yaml"), "--as-of", as_of,
                           "--no-progress"], cwd=runs["local"], capture_output=True, text=True, timeout=400)
    assert here.returncode == 0, here.stdout[-2000:] + here.stderr[-2000:]

    ledgers = {where: PrivacyLedger(f"sqlite:///{folder / 'ledger.db'}") for where, folder in runs.items()}
    (charge,) = ledgers["cluster"].history("visits")
    assert charge.status == "committed" and charge.steps_run == FLOW_STEPS
    tables = {where: [(b.block, b.charges, b.committed_epsilon) for b in ledger.blocks("visits")]
              for where, ledger in ledgers.items()}
    assert [b for b, _, _ in tables["cluster"]] == ["2026-11-01", "2026-11-02"]
    assert [(b, n) for b, n, _ in tables["cluster"]] == [(b, n) for b, n, _ in tables["local"]]
    assert [e for _, _, e in tables["cluster"]] == pytest.approx([e for _, _, e in tables["local"]], rel=1e-12)
    client = mlflow.MlflowClient(f"sqlite:///{runs['cluster'] / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FINISHED" and run.info.run_id == charge.run_id
