"""Starting a local Ray again when it did not come up in time.

Ray 2.60 gives a starting node a fixed 30 s to register its raylet with the GCS and then
raises "The current node timed out during startup". On a loaded machine (two test suites on
two cores, a 1-minute load of 25 or more) that wait runs out although nothing is wrong, and a
second start usually succeeds. ``start_with_retries`` runs a start again after that error
only, stopping first the processes the failed attempt left behind: its GCS, raylet and
reaper are this process's children, which Ray does not stop when its node fails to start.
They are told from other children started meanwhile (``offmeta run`` imports Prefect, which
may start its server, while Ray starts) by their command lines, which name Ray's package.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

RAY_START_TIMEOUT = "timed out during startup"
"""Part of the message Ray raises when a node's raylet did not register within its 30 s."""

RAY_START_ATTEMPTS = 3
"""How many times ``offmeta run`` starts a local Ray before it gives up."""


def start_with_retries(
    start: Callable[[], None],
    *,
    attempts: int = RAY_START_ATTEMPTS,
    say: Callable[[str], None] | None = None,
    ray_package: Path | None = None,
) -> None:
    """Call ``start`` until it returns, at most ``attempts`` times; only Ray's start timeout
    is tried again (any other error, and the last attempt's, is raised). Before each new
    attempt the failed one's processes are killed: this process's children started since it
    began whose command line names ``ray_package`` (default: the installed ``ray``), with
    their descendants. ``say`` (default: a line on stderr) tells why the start is repeated."""
    say = say or _to_stderr
    for attempt in range(1, attempts + 1):
        before = set(children(os.getpid()))
        try:
            start()
            return
        except Exception as error:
            if RAY_START_TIMEOUT not in str(error) or attempt == attempts:
                raise
            package = str(ray_package or _installed_ray())
            by_parent = _children_by_parent()  # one read of /proc for the whole tree
            left = [
                pid
                for child in by_parent.get(os.getpid(), [])
                if child not in before and package in _command_line(child)
                for pid in (child, *_below(by_parent, child))
            ]
            kill(left)
            say(
                f"Ray did not start within its 30 s (1-minute load {os.getloadavg()[0]:.1f}); "
                f"stopped the {len(left)} process(es) it left and starting it again "
                f"(attempt {attempt + 1} of {attempts})"
            )


def children(pid: int) -> list[int]:
    """The pids of ``pid``'s own children."""
    return _children_by_parent().get(pid, [])


def descendants(pid: int) -> list[int]:
    """The pids of ``pid``'s children, their children and so on (read from ``/proc``; empty
    where there is none)."""
    return _below(_children_by_parent(), pid)


def _below(by_parent: dict[int, list[int]], pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        for child in by_parent.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _children_by_parent() -> dict[int, list[int]]:
    by_parent: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                    by_parent.setdefault(int(fields[1]), []).append(int(entry.name))
    return by_parent


def _command_line(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def _installed_ray() -> Path:
    spec = importlib.util.find_spec("ray")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("ray is not installed")
    return Path(spec.submodule_search_locations[0])


def kill(pids: list[int]) -> None:
    """SIGKILL each of ``pids`` that is still there."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _to_stderr(line: str) -> None:
    print(f"offmeta: {line}", file=sys.stderr, flush=True)
