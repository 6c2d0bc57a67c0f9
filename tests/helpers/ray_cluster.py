"""A Ray cluster of a head and worker nodes on loopback, whose nodes do not share a disk.

Each node is a ``ray start --block`` process; each worker node runs in its own mount
namespace with a private tmpfs over ``/tmp`` and over the head's ``root`` (where a test
keeps its data and run directories), so a path on the head is not there on a worker node,
as on separate machines::

    unshare --mount --propagation private sh -c 'mount -t tmpfs tmpfs /tmp && ... &&
        exec ray start --address=HEAD --block'

The cluster uses Ray 2.60's token authentication (``RAY_AUTH_MODE=token``, with a token of
its own in ``RAY_AUTH_TOKEN``, so ``~/.ray/auth_token`` is neither read nor written); a
driver joins it with ``environment`` and ``--set ray.address=ADDRESS``. Its ports are free
ports picked at start and its session directories are its own, so it runs beside the test
session's local Ray (``tests/conftest.py``) and other clusters on the machine. It is stopped
by the pids of its ``ray start`` processes (never ``ray stop``, which would stop every Ray
on the machine).

Mount namespaces need root or a user namespace; ``mount_namespaces_refusal`` says why they
are not permitted, and the fixture skips with that reason (on the development machine and
in CI, which is that machine, they are permitted and the cluster tests run).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from flows.process.ray_start import descendants
from tests.helpers.paths import REPO

RAY = str(Path(sys.executable).with_name("ray"))
_START_TIMEOUT_S = 90.0
_STOP_TIMEOUT_S = 10.0
"""Grace of a node's SIGTERM, all nodes at once: nodes stop in under 3 s, but after the node
kill one stayed for a whole 30 s grace (suite durations); the tests are over, so the rest is
SIGKILL."""
_UNSHARE = ["unshare", "--mount", "--propagation", "private"]
# The head's GCS declares a node dead after 3 failed health checks 1 s apart (Ray's defaults,
# 5 checks 3 s apart, leave a node-kill test waiting 15 s): a raylet that is alive answers
# within the 10 s each check allows even on a busy machine.
_FAST_NODE_DEATH = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}

_WAIT_FOR_NODES = """
import sys, time, ray
ray.init(address=sys.argv[1], logging_level="ERROR")
deadline = time.monotonic() + float(sys.argv[3])
while sum(node["Alive"] for node in ray.nodes()) < int(sys.argv[2]):
    if time.monotonic() > deadline:
        sys.exit(f"{sum(n['Alive'] for n in ray.nodes())} of {sys.argv[2]} nodes joined")
    time.sleep(0.5)
print(next(n["NodeID"] for n in ray.nodes() if "node:__internal_head__" in n["Resources"]))
"""


@dataclass(frozen=True)
class WorkerNode:
    """One worker node: its ``ray start`` process and its log."""

    process: subprocess.Popen[bytes]
    log: Path

    def raylet_pid(self) -> int:
        """The pid of this node's raylet (killing it takes the node out of the cluster)."""
        for pid in descendants(self.process.pid):
            if Path(f"/proc/{pid}/exe").resolve().name == "raylet":
                return pid
        raise RuntimeError(f"worker node {self.process.pid} has no raylet; see {self.log}")


@dataclass(frozen=True)
class RayCluster:
    """A running cluster: where to join it and what its worker nodes cannot see."""

    address: str
    """``127.0.0.1:PORT`` of the head, for ``ray.address``."""
    environment: dict[str, str]
    """The variables a driver joining the cluster needs (token authentication, this
    checkout on ``PYTHONPATH``), on top of ``os.environ``."""
    hidden: Path
    """A directory of the head that the worker nodes do not see (a tmpfs there)."""
    head_node_id: str
    worker_nodes: tuple[WorkerNode, ...]


def mount_namespaces_refusal() -> str | None:
    """Why a private mount namespace with a tmpfs cannot be made here (None: it can)."""
    with tempfile.TemporaryDirectory(prefix="offmeta-ns-") as probe:
        try:
            done = subprocess.run(
                [*_UNSHARE, "mount", "-t", "tmpfs", "tmpfs", probe],
                capture_output=True,
                text=True,
                timeout=30,
            )
        except FileNotFoundError:
            return "unshare (util-linux) is not installed"
    if done.returncode != 0:
        return f"mount namespaces are not permitted here: {done.stderr.strip()}"
    return None


@contextlib.contextmanager
def ray_cluster(
    hidden: Path, *, worker_nodes: int = 2, head_cpus: int = 0, worker_cpus: int = 1
) -> Iterator[RayCluster]:
    """Start a head (``head_cpus``) and ``worker_nodes`` worker nodes (``worker_cpus``
    each) that do not see ``/tmp`` or ``hidden``; stop every node on exit.

    With ``head_cpus=0`` nothing but drivers and Ray's own actors runs on the head, so
    Ray Train workers and read jobs run on the worker nodes, where the head's local paths
    are missing.
    """
    token = secrets.token_hex(32)
    environment = {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": token,
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONPATH": str(REPO),
    }
    env = dict(os.environ, **environment)
    port = _free_port()
    address = f"127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="om-ray-", dir="/tmp") as scratch:
        # Short paths: Ray's unix sockets live under the temp dir (107 characters at most).
        head_log = Path(scratch) / "head.log"
        processes: list[subprocess.Popen[bytes]] = []
        try:
            head = _start(
                [
                    RAY, "start", "--head", "--block", f"--port={port}",
                    f"--num-cpus={head_cpus}", f"--temp-dir={scratch}/head",
                    *_node_ports(), "--include-dashboard=false",
                    f"--dashboard-port={_free_port()}",
                ],
                dict(env, **_FAST_NODE_DEATH),
                head_log,
            )  # fmt: skip
            processes.append(head)
            _wait_for_nodes(address, 1, env, processes, head_log)
            nodes = []
            for index in range(worker_nodes):
                log = Path(scratch) / f"worker-{index}.log"
                start = shlex.join(
                    [
                        RAY, "start", f"--address={address}", "--block",
                        f"--num-cpus={worker_cpus}", "--temp-dir=/tmp/ray-node", *_node_ports(),
                    ]
                )  # fmt: skip
                mounts = _mount_commands(hidden)
                process = _start([*_UNSHARE, "sh", "-c", f"{mounts} && exec {start}"], env, log)
                processes.append(process)
                nodes.append(WorkerNode(process, log))
            head_id = _wait_for_nodes(address, 1 + worker_nodes, env, processes, head_log)
            yield RayCluster(address, environment, hidden, head_id, tuple(nodes))
        finally:
            _stop(list(reversed(processes)))


def _start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        # A session of its own: the node's processes are stopped together, by its pid.
        return subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _node_ports() -> list[str]:
    """Ports that default to fixed numbers, which nodes on one IP would share."""
    return [
        "--node-ip-address=127.0.0.1",
        f"--dashboard-agent-listen-port={_free_port()}",
        "--disable-usage-stats",
    ]


def _mount_commands(hidden: Path) -> str:
    """What a worker node's shell runs in its namespace before ``ray start``: a tmpfs over
    ``/tmp`` and ``hidden``, then the checkout and the Python environment the node runs
    mounted back where they lie under ``/tmp`` (a fresh clone there, as CI may make), so the
    node still finds its code while the data and run dirs stay out of its sight."""
    tmp = Path("/tmp")
    needed = {REPO.resolve(), Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}
    under_tmp = [path for path in needed if path.is_relative_to(tmp)]
    keep = sorted(
        p for p in under_tmp if not any(p != q and p.is_relative_to(q) for q in under_tmp)
    )
    # The namespace's own view of the old /tmp, reached through /mnt once /tmp is covered.
    commands = ["mount --bind /tmp /mnt"] if keep else []
    commands += [f"mount -t tmpfs tmpfs {shlex.quote(str(p))}" for p in _mount_points(hidden)]
    for path in keep:
        quoted, seen = shlex.quote(str(path)), shlex.quote(str("/mnt" / path.relative_to(tmp)))
        commands += [f"mkdir -p {quoted}", f"mount --bind {seen} {quoted}"]
    return " && ".join(commands)


def _mount_points(hidden: Path) -> list[Path]:
    """``/tmp`` and ``hidden`` (unless it is under ``/tmp``)."""
    tmp = Path("/tmp")
    resolved = hidden.resolve()
    return [tmp] if resolved.is_relative_to(tmp) else [tmp, resolved]


def _wait_for_nodes(
    address: str,
    count: int,
    env: dict[str, str],
    processes: list[subprocess.Popen[bytes]],
    log: Path,
) -> str:
    """Wait until ``count`` nodes are alive (fail at once when a node's process exits);
    returns the head's node id."""
    argv = [sys.executable, "-c", _WAIT_FOR_NODES, address, str(count), str(_START_TIMEOUT_S)]
    waiter = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + _START_TIMEOUT_S + 30
    while waiter.poll() is None:
        exited = [process for process in processes if process.poll() is not None]
        if exited or time.monotonic() > deadline:
            waiter.kill()
            break
        time.sleep(0.2)
    out, err = waiter.communicate()
    if waiter.returncode != 0:
        tail = log.read_text(errors="replace")[-2000:]
        exited = [
            f"pid {p.pid} exited with status {p.returncode}"
            for p in processes
            if p.poll() is not None
        ]
        why = "; ".join(exited) or f"not within {_START_TIMEOUT_S:g} s"
        raise RuntimeError(
            f"the Ray cluster at {address} did not start ({count} nodes expected; {why}): "
            f"{err.decode(errors='replace').strip()[-1000:]}\nthe head's log ends:\n{tail}"
        )
    return out.decode().strip().splitlines()[-1]


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to every ``ray start --block`` at once (each stops its node's processes), then
    SIGKILL to the process group of each node that has not gone within the grace."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + _STOP_TIMEOUT_S
    for process in processes:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=_STOP_TIMEOUT_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
