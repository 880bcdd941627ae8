"""A Ray cluster of separate hosts on one machine: a head, N worker nodes and a driver host, each node its
own ``ray start --block`` process. privzo's multi-node tests use it; a team can use it to try a spec on a
cluster before it has one (``make cluster-up`` / ``make cluster-down``).

Two modes, chosen by what this machine allows (``--mode auto`` tries the first):

- ``netns``: every host is a network namespace made here, with its own address (10.77.0.K/24) on a private
  switch (a bridge in a namespace of its own) and no other link: nodes reach each other only through
  that switch, and a killed node's processes are exactly the processes in its namespace.
- ``loopback``: every host is a loopback address (127.0.0.K) given to Ray as ``--node-ip-address``, with
  ports of its own. Needs no privilege; the hosts share the machine's one network stack.

Every process started is recorded (pid) in the state file and stopped by that pid; the namespaces made
are deleted. Usage::

    python infra/ray/cluster.py up --workers 2 --state .ray-cluster     # prints execution.address
    python infra/ray/cluster.py exec --state .ray-cluster -- privzo run spec.yaml   # on the driver host
    python infra/ray/cluster.py down --state .ray-cluster
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Dict, List, Optional

import psutil

GCS_PORT = 6379
CLIENT_PORT = 10001
SUBNET = "10.77.0"
# the driver host's address, last in the subnet; node K (head K=1) is SUBNET.K
DRIVER_HOST = 254
NODE_ATTEMPTS = 3


class NodeExited(RuntimeError):
    """A node's ``ray start`` ended while the cluster was coming up."""


def _ray_bin() -> str:
    found = Path(sys.executable).with_name("ray")
    return str(found) if found.exists() else shutil.which("ray") or "ray"


def netns_available() -> bool:
    """Whether this process may make network namespaces (root, or CAP_NET_ADMIN and CAP_SYS_ADMIN)."""
    if shutil.which("ip") is None:
        return False
    name = f"pzprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode == 0
    if made:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return made


def _sh(*argv: str) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv)}: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")


class LocalCluster:
    """Head + ``workers`` worker nodes + a driver host. ``nodes[0]`` is the head."""

    def __init__(self, state: Path, workers: int = 2, mode: str = "auto", cpus_per_node: int = 2,
                 head_cpus: int = 0, object_store_bytes: int = 200 * 2**20, env: Optional[Dict[str, str]] = None):
        self.state = Path(state)
        self.extra_env = dict(env or {})  # e.g. Ray's health-check settings, for every node and the driver
        self.workers = workers
        self.requested_mode = mode
        self.cpus_per_node = cpus_per_node
        self.head_cpus = head_cpus
        self.object_store_bytes = object_store_bytes
        self.info: Dict = {}

    # ---------------------------------------------------------------- state
    @classmethod
    def load(cls, state: Path) -> "LocalCluster":
        cluster = cls(state)
        cluster.info = json.loads((Path(state) / "cluster.json").read_text())
        cluster.workers = len(cluster.info["nodes"]) - 1
        return cluster

    def _save(self) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        (self.state / "cluster.json").write_text(json.dumps(self.info, indent=1))

    @property
    def mode(self) -> str:
        return self.info["mode"]

    @property
    def head_ip(self) -> str:
        return self.info["nodes"][0]["ip"]

    @property
    def gcs_address(self) -> str:
        return f"{self.head_ip}:{GCS_PORT}"

    @property
    def client_address(self) -> str:
        """What a driver on its own host sets as ``execution.address``: Ray Client on the head."""
        return f"ray://{self.head_ip}:{CLIENT_PORT}"

    @property
    def driver_ip(self) -> str:
        return self.info["driver"]["ip"]

    # ---------------------------------------------------------------- up / down
    def up(self, timeout: float = 180.0) -> "LocalCluster":
        mode = self.requested_mode
        if mode == "auto":
            mode = "netns" if netns_available() else "loopback"
        if mode == "netns" and not netns_available():
            raise RuntimeError("cluster: mode netns needs the right to make network namespaces (root or "
                               "CAP_NET_ADMIN); use --mode loopback")
        tag = uuid.uuid4().hex[:6]
        self.info = {"mode": mode, "tag": tag, "nodes": [], "driver": {}, "namespaces": [],
                     "temp_dir": tempfile.mkdtemp(prefix=f"pzray{tag}-", dir="/tmp")}
        self._save()
        fd = os.open(self.token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_hex(32))
        try:
            if mode == "netns":
                self._make_network(tag)
            else:
                self.info["driver"] = {"ip": "127.0.0.1", "netns": None}  # this process's own stack
                self.info["nodes"] = [{"name": "head" if k == 0 else f"worker{k}", "ip": f"127.0.0.{k + 2}",
                                       "netns": None, "pid": None} for k in range(self.workers + 1)]
            self._save()
            # one node at a time, each once the last is alive: a node's `ray start` gives up when its raylet
            # has not registered within 30 s (fixed in Ray), which a busy machine can exceed; it is tried again
            for k in range(self.workers + 1):
                for attempt in range(NODE_ATTEMPTS):
                    self.start_node(k)
                    try:
                        self.wait_for_nodes(k + 1, timeout)
                        break
                    except NodeExited:
                        self.kill_node(k)
                        if attempt == NODE_ATTEMPTS - 1:
                            raise
        except BaseException:
            self.down()
            raise
        return self

    def _make_network(self, tag: str) -> None:
        switch = f"pz{tag}sw"
        _sh("ip", "netns", "add", switch)
        self.info["namespaces"].append(switch)
        self._save()
        _sh("ip", "-n", switch, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", switch, "link", "set", "br0", "up")
        hosts = [("head" if k == 0 else f"worker{k}", k + 1) for k in range(self.workers + 1)]
        hosts.append(("driver", DRIVER_HOST))
        for name, last in hosts:
            netns = f"pz{tag}{name}"
            _sh("ip", "netns", "add", netns)
            self.info["namespaces"].append(netns)
            self._save()
            port = f"p{last}"  # the switch's end of this host's cable
            _sh("ip", "-n", switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", netns)
            _sh("ip", "-n", switch, "link", "set", port, "master", "br0", "up")
            _sh("ip", "-n", netns, "addr", "add", f"{SUBNET}.{last}/24", "dev", "eth0")
            _sh("ip", "-n", netns, "link", "set", "eth0", "up")
            _sh("ip", "-n", netns, "link", "set", "lo", "up")
            host = {"name": name, "ip": f"{SUBNET}.{last}", "netns": netns, "pid": None}
            if name == "driver":
                self.info["driver"] = host
            else:
                self.info["nodes"].append(host)

    def _node_argv(self, k: int) -> List[str]:
        node = self.info["nodes"][k]
        argv = [_ray_bin(), "start", "--block", "--node-ip-address", node["ip"], "--disable-usage-stats",
                "--object-store-memory", str(self.object_store_bytes), "--log-style", "record"]
        if k == 0:
            argv += ["--head", "--port", str(GCS_PORT), "--ray-client-server-port", str(CLIENT_PORT),
                     "--include-dashboard", "false", "--num-cpus", str(self.head_cpus),
                     "--temp-dir", self.info["temp_dir"]]
        else:
            argv += ["--address", self.gcs_address, "--num-cpus", str(self.cpus_per_node)]
        if self.mode == "loopback":
            # one network stack for every host: each node's listening ports are its own
            base = 20000 + 1000 * k
            argv += ["--node-manager-port", str(base), "--object-manager-port", str(base + 1),
                     "--dashboard-agent-listen-port", str(base + 2), "--dashboard-agent-grpc-port", str(base + 3),
                     "--metrics-export-port", str(base + 4), "--runtime-env-agent-port", str(base + 5),
                     "--min-worker-port", str(base + 100), "--max-worker-port", str(base + 999)]
            if k == 0:
                argv += ["--dashboard-port", str(base + 6)]
        return argv

    def _on_host(self, netns: Optional[str], argv: List[str]) -> List[str]:
        return ["ip", "netns", "exec", netns, *argv] if netns else argv

    @property
    def token_path(self) -> Path:
        return self.state / "auth_token"

    def env(self) -> Dict[str, str]:
        """The environment of every node and of the driver: Ray's token authentication, with this cluster's
        own token (a node or driver without it is refused by every Ray service)."""
        return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN_PATH": str(self.token_path.resolve()), **self.extra_env}

    def start_node(self, k: int) -> int:
        node = self.info["nodes"][k]
        log = open(self.state / f"{node['name']}.log", "ab")
        proc = subprocess.Popen(self._on_host(node["netns"], self._node_argv(k)), stdout=log, stderr=log,
                                stdin=subprocess.DEVNULL, env=self.env(), start_new_session=True)
        node["pid"] = proc.pid
        self._save()
        return proc.pid

    def kill_node(self, k: int) -> None:
        """SIGKILL the node's whole process tree (``ray start`` and every raylet, store and worker under it);
        in netns mode also anything else left in its namespace."""
        node = self.info["nodes"][k]
        _kill_tree(node["pid"])
        if node["netns"]:
            for pid in _netns_pids(node["netns"]):
                _kill_tree(pid)
        node["pid"] = None
        self._save()

    def running(self) -> bool:
        return any(node["pid"] and _running(node["pid"]) for node in self.info.get("nodes", []))

    def down(self) -> None:
        for k in reversed(range(len(self.info.get("nodes", [])))):
            self.kill_node(k)
        temp = self.info.get("temp_dir")
        if temp:  # a raylet or worker whose `ray start` died first is no longer in its tree: found by its session
            for proc in psutil.process_iter(["cmdline"]):
                if any(temp in part for part in proc.info["cmdline"] or ()):
                    _kill_tree(proc.pid)
        for netns in reversed(self.info.get("namespaces", [])):
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        self.info["namespaces"] = []
        if temp:
            shutil.rmtree(temp, ignore_errors=True)
        if self.state.exists():
            self._save()

    # ---------------------------------------------------------------- the driver host
    def driver_argv(self, argv: List[str]) -> List[str]:
        return self._on_host(self.info["driver"].get("netns"), list(argv))

    def run_on_driver(self, argv: List[str], **kwargs) -> subprocess.CompletedProcess:
        kwargs["env"] = {**self.env(), **kwargs.get("env", {})}
        return subprocess.run(self.driver_argv(argv), **kwargs)

    def wait_for_nodes(self, count: int, timeout: float = 180.0) -> None:
        """Until ``count`` nodes are alive, seen from the driver host through Ray Client."""
        probe = ("import sys, time, ray\n"
                 f"ray.init({self.client_address!r}, log_to_driver=False)\n"
                 f"end = time.time() + {timeout}\n"
                 "while True:\n"
                 "    alive = sum(1 for n in ray.nodes() if n['Alive'])\n"
                 f"    if alive >= {count} or time.time() > end: break\n"
                 "    time.sleep(0.5)\n"
                 "print(alive)\n")
        deadline = time.time() + timeout
        last = ""
        while time.time() < deadline:
            for node in self.info["nodes"]:
                if node["pid"] and not _running(node["pid"]):
                    raise NodeExited(f"cluster: {node['name']} exited; see {self.state / (node['name'] + '.log')}")
            done = self.run_on_driver([sys.executable, "-c", probe], capture_output=True, text=True,
                                      timeout=timeout + 30)
            if done.returncode == 0 and done.stdout.strip().splitlines()[-1:] == [str(count)]:
                return
            last = (done.stderr or done.stdout).strip().splitlines()[-1:] if done.returncode else done.stdout
            time.sleep(1.0)
        raise RuntimeError(f"cluster: {count} nodes not alive after {timeout:.0f} s ({last})")


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _netns_pids(netns: str) -> List[int]:
    done = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []


def _kill_tree(pid: Optional[int]) -> None:
    if not pid:
        return
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for proc in tree:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(tree, timeout=10)


def check(cluster: LocalCluster, spec_paths: List[Path], workers: int = 2) -> int:
    """Run each spec whole through privzo's Prefect flow on the driver host, on the cluster: a copy of it with
    ``execution.address`` set to the cluster's and MLflow in the state folder. Prints one line a spec."""
    import yaml

    root = Path(__file__).resolve().parents[2]
    privzo = Path(sys.executable).with_name("privzo")
    failed = 0
    for path in spec_paths:
        spec = yaml.safe_load(Path(path).read_text())
        spec["execution"] = {**spec.get("execution", {}), "backend": "ray", "workers": workers,
                             "address": cluster.client_address}
        spec["tracking"] = {**spec.get("tracking", {}), "uri": f"sqlite:///{(cluster.state / 'mlflow.db').resolve()}"}
        spec["checkpoint"] = {"dir": str((cluster.state / "checkpoints").resolve())}
        # relative data paths stay relative to the spec's own folder
        copy = Path(path).resolve().parent / f".cluster-{Path(path).name}"
        copy.write_text(yaml.safe_dump(spec, sort_keys=False))
        start = time.time()
        try:
            done = cluster.run_on_driver([str(privzo), "run", "--no-progress", str(copy)], cwd=root,
                                         capture_output=True, text=True)
        finally:
            copy.unlink()
        (cluster.state / f"{Path(path).stem}.out").write_text(done.stdout + done.stderr)
        summary = [line for line in done.stdout.splitlines() if line.startswith(("privacy:", f"{spec['name']}:"))]
        failed += done.returncode != 0
        print(f"{path}: rc {done.returncode}, {time.time() - start:.0f} s; " + " | ".join(summary or
              (done.stderr or done.stdout).strip().splitlines()[-1:]), flush=True)
    return 1 if failed else 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="cluster.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a head, worker nodes and a driver host")
    up.add_argument("--workers", type=int, default=2)
    up.add_argument("--cpus-per-node", type=int, default=2)
    up.add_argument("--mode", choices=["auto", "netns", "loopback"], default="auto")
    checking = sub.add_parser("check", help="start a cluster, run specs through privzo's flow on it, stop it")
    checking.add_argument("specs", nargs="+", type=Path)
    checking.add_argument("--mode", choices=["auto", "netns", "loopback"], default="auto")
    for p in (up, checking, sub.add_parser("down", help="stop everything the state file records"),
              sub.add_parser("exec", help="run a command on the driver host")):
        p.add_argument("--state", type=Path, default=Path(".ray-cluster"))
    sub.choices["exec"].add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "check":
        cluster = LocalCluster(args.state, 2, args.mode).up()
        try:
            print(f"cluster up ({cluster.mode}): head {cluster.gcs_address}, 2 worker nodes, driver host "
                  f"{cluster.driver_ip}", flush=True)
            return check(cluster, args.specs)
        finally:
            cluster.down()
    if args.command == "up":
        if (args.state / "cluster.json").exists() and LocalCluster.load(args.state).running():
            parser.error(f"{args.state}: a cluster is already up; run down first")
        cluster = LocalCluster(args.state, args.workers, args.mode, args.cpus_per_node).up()
        print(f"cluster up ({cluster.mode}): head {cluster.gcs_address}, {args.workers} worker nodes, "
              f"driver host {cluster.driver_ip}\nexecution.address: {cluster.client_address}")
        return 0
    if not (args.state / "cluster.json").exists():
        parser.error(f"{args.state}/cluster.json: no cluster recorded there")
    cluster = LocalCluster.load(args.state)
    if args.command == "down":
        cluster.down()
        print("cluster down")
        return 0
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    return cluster.run_on_driver(command).returncode


if __name__ == "__main__":
    sys.exit(main())
