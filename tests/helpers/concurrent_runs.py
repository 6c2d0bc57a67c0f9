"""Several real ``offmeta run`` processes started together and watched to their end: each
one's exit status and output, the wall time of them all, and the peak of their memory
together (the resident sets of every process in their process groups, Ray's included,
sampled from /proc; pages shared between processes count once per process)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.flow_runs import tiny_document, write_config
from tests.helpers.offmeta_process import offmeta, reap

_SAMPLE_S = 0.5
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Ended:
    """One ``offmeta run`` that ended."""

    returncode: int
    output: str
    """Its stdout and stderr together."""


@dataclass(frozen=True)
class Together:
    """What the runs started together did."""

    ended: list[Ended]
    wall_s: float
    """From the first start to the last end."""
    peak_rss_mb: float
    """The highest sum of the runs' resident sets at one sample."""
    peak_process_rss_mb: float
    """The highest resident set of one process at one sample."""


def seeded_configs(
    data: Path, work: Path, artifacts_root: str, runs: int, ray_address: str, name: str
) -> list[Path]:
    """``runs`` tiny point-robot run configs under ``work``, publishing ``name`` to
    ``artifacts_root``, their runs under ``work/runs``, on the Ray at ``ray_address``; run
    ``i`` initialises its model with seed ``i`` (``learners.seed``), so no two publish the
    same parameters."""
    overrides = [
        f"artifacts.root={artifacts_root}",
        f"artifacts.name={name}",
        f"ray.address={ray_address}",
    ]
    return [
        write_config(
            work / f"run-{seed}.yaml",
            tiny_document(data, work, [*overrides, f"learners.seed={seed}"]),
        )
        for seed in range(runs)
    ]


def run_together(
    work: Path, configs: Sequence[Path], environment: Mapping[str, str], *, deadline_s: float
) -> Together:
    """Start ``offmeta run --config C`` for every ``C`` of ``configs`` at once, in ``work``,
    recording on the test's Prefect server, with ``environment`` added to their variables
    (a Ray cluster's); wait for all of them. A run still going after
    ``deadline_s`` is killed (with all it started) and ``TimeoutError`` names every such run
    and the last lines it printed."""
    began = time.monotonic()
    processes = [offmeta(work, config, environment=environment) for config in configs]
    outputs: list[str] = [""] * len(processes)

    def drain(index: int) -> None:  # a full pipe would stop the run
        outputs[index] = processes[index].communicate()[0]

    readers = [threading.Thread(target=drain, args=(i,), daemon=True) for i in range(len(configs))]
    for reader in readers:
        reader.start()
    groups = {process.pid for process in processes}
    peak_total = peak_one = 0
    try:
        while any(process.poll() is None for process in processes):
            if time.monotonic() - began > deadline_s:
                raise TimeoutError(_late(configs, processes, deadline_s))
            sizes = _resident_sets(groups)
            peak_total, peak_one = max(peak_total, sum(sizes)), max([peak_one, *sizes])
            time.sleep(_SAMPLE_S)
        wall = time.monotonic() - began
    finally:
        for process in processes:
            reap(process)
    for reader in readers:
        reader.join(timeout=60)
    return Together(
        ended=[Ended(p.returncode, output) for p, output in zip(processes, outputs, strict=True)],
        wall_s=wall,
        peak_rss_mb=peak_total / 2**20,
        peak_process_rss_mb=peak_one / 2**20,
    )


def _late(configs: Sequence[Path], processes: Sequence, deadline_s: float) -> str:
    late = [str(config) for config, p in zip(configs, processes, strict=True) if p.poll() is None]
    return (
        f"{len(late)} of {len(configs)} offmeta runs had not ended {deadline_s:.0f} s after "
        f"they started together: {', '.join(late)} (killed)"
    )


def _resident_sets(groups: set[int]) -> list[int]:
    """The resident set, in bytes, of every live process in one of the process ``groups``."""
    sizes = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            statm = Path(entry.path, "statm").read_text()
        except OSError:  # it ended between the listing and the read
            continue
        # The fields after the command (which may hold spaces) start with the state; the
        # process group is the third of them.
        if int(stat.rpartition(")")[2].split()[2]) in groups:
            sizes.append(int(statm.split()[1]) * _PAGE)
    return sizes
