"""Benchmark records: one JSON file per measured figure, with the machine and revision.

Every bench script calls ``write_record`` once per figure it prints. A record holds

- ``bench``, ``figure`` (an id, stable across runs), ``description``;
- ``value`` and ``unit``: what was measured;
- ``baseline``: ``{"description", "value"}`` measured in the same run (same unit), or null;
- ``ratio``: ``value / baseline.value`` unless the bench passes its own (the median of
  per-round ratios, say; the description says so), null without a baseline;
- ``target``: a bound such as ``">= 0.5"`` on the ratio (on the value when there is no
  baseline), or null for report-only figures; ``met``: whether the bound held, or null;
- ``shape``: the sizes measured (rows, files, tasks, ...), so that runs of other sizes are
  never mixed into one range; ``details``: anything else the bench printed (per-round values);
- ``machine`` (cores, CPU model, RAM, device), ``software`` (python, torch, ray, pyarrow),
  ``git`` (revision, whether the checkout had uncommitted changes), ``date`` (UTC).

Records are append-only: each is written to a new file named
``BENCH-YYYYmmddTHHMMSS.ffffffZ-FIGURE.json`` and an existing file is never replaced.
``bench/readme_table.py`` turns them into docs/performance.md's table and the README's figures.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import subprocess
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
REQUIRED = (
    "bench",
    "figure",
    "description",
    "value",
    "unit",
    "baseline",
    "ratio",
    "target",
    "met",
    "shape",
    "machine",
    "software",
    "git",
    "date",
)
"""Fields every record has (``details`` is optional)."""

# Bench names are script names, which may hold '_' (bench/offline_rl.py).
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")
_TARGET = re.compile(r"(<=|>=) *(-?[0-9]+(?:\.[0-9]+)?)")


class Baseline(NamedTuple):
    """What a figure is compared against, measured in the same run, in the figure's unit."""

    description: str
    value: float


def write_record(
    bench: str,
    figure: str,
    description: str,
    value: float,
    unit: str,
    *,
    shape: dict[str, Any],
    baseline: Baseline | None = None,
    ratio: float | None = None,
    target: str | None = None,
    details: dict[str, Any] | None = None,
    device: str = "cpu",
    directory: Path = RESULTS,
) -> Path:
    """Write one figure's record to a new file in ``directory`` and return its path.

    ``device`` is the torch device the figure ran on ("cpu", "cuda", "cuda:1"); a CUDA
    device is recorded by its name. Bad arguments are refused before anything is written.
    """
    for field, name in (("bench", bench), ("figure", figure)):
        if not _NAME.fullmatch(name):
            raise ValueError(
                f"record {field} {name!r} is not a name: use lower-case letters, digits, '-' "
                "and '_' (it becomes part of the file name)"
            )
    _check_number(f"{bench}/{figure} value", value)
    if baseline is not None:
        _check_number(f"{bench}/{figure} baseline value", baseline.value)
        if ratio is None:
            if baseline.value == 0:
                raise ValueError(
                    f"{bench}/{figure}: the baseline value is 0, so value / baseline has no "
                    "ratio; pass ratio= explicitly or choose a baseline that is not 0"
                )
            ratio = value / baseline.value
    elif ratio is not None:
        raise ValueError(
            f"{bench}/{figure}: a ratio of {ratio} was given without a baseline; pass "
            "baseline=Baseline(description, value) measured in the same run"
        )
    if ratio is not None:
        _check_number(f"{bench}/{figure} ratio", ratio)
    met = None if target is None else meets(ratio if ratio is not None else value, target)
    now = datetime.now(UTC)
    record = {
        "bench": bench,
        "figure": figure,
        "description": description,
        "value": value,
        "unit": unit,
        "baseline": None if baseline is None else baseline._asdict(),
        "ratio": ratio,
        "target": target,
        "met": met,
        "shape": shape,
        "details": details or {},
        "machine": machine_facts(device),
        "software": software_versions(),
        "git": git_revision(),
        "date": now.isoformat(),
    }
    text = json.dumps(record, indent=2, sort_keys=True) + "\n"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{bench}-{now:%Y%m%dT%H%M%S.%fZ}-{figure}.json"
    # Written aside, then linked into place: the link fails rather than replace a record,
    # and a reader never sees a half-written one.
    partial = directory / f".{path.name}.partial"
    try:
        partial.write_text(text)
        os.link(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def meets(number: float, target: str) -> bool:
    """Whether ``number`` satisfies ``target`` (``"<= X"`` or ``">= X"``)."""
    match = _TARGET.fullmatch(target.strip())
    if match is None:
        raise ValueError(f"target {target!r} is not a bound: write '<= NUMBER' or '>= NUMBER'")
    bound = float(match.group(2))
    return number <= bound if match.group(1) == "<=" else number >= bound


def read_records(directory: Path = RESULTS) -> list[dict[str, Any]]:
    """Every record in ``directory`` (none when it does not exist), oldest first."""
    records = []
    for path in sorted(directory.glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not a JSON record ({error}); remove or fix it") from None
        missing = [f for f in REQUIRED if f not in record] if isinstance(record, dict) else ["all"]
        if missing:
            raise ValueError(
                f"{path}: a record is a JSON object with the fields {', '.join(REQUIRED)}; "
                f"missing: {', '.join(missing)}"
            )
        records.append(record)
    return sorted(records, key=lambda record: datetime.fromisoformat(record["date"]))


def machine_facts(device: str = "cpu") -> dict[str, Any]:
    """Cores, CPU model, RAM in bytes, the device's name, and the 1-minute load average
    (the machine is shared: load explains a slow run)."""
    if device.startswith("cuda"):
        import torch

        device_name = torch.cuda.get_device_name(torch.device(device))
    else:
        device_name = device
    return {
        "cores": os.cpu_count(),
        "cpu": _cpu_model(),
        "ram_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "device": device_name,
        "load_average_1m": os.getloadavg()[0],
    }


def software_versions() -> dict[str, str | None]:
    """Python and the installed torch, ray and pyarrow (None where not installed)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for package in ("torch", "ray", "pyarrow"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return versions


def git_revision(directory: Path = ROOT) -> dict[str, Any]:
    """``{"revision", "dirty"}`` of the checkout; dirty means changes other than new records
    (tracked or not). Both null outside a git checkout. ``OFFMETA_GIT_REVISION``, when set,
    names the revision instead: a copy of a working tree sent to a GPU machine may carry no
    repository, or a stale one, and its sender knows which commit it is."""
    sent = os.environ.get("OFFMETA_GIT_REVISION")
    if sent:
        return {"revision": sent, "dirty": None}
    try:
        head = _git(directory, "rev-parse", "HEAD")
        status = _git(directory, "status", "--porcelain", "--", ".", ":(exclude)bench/results")
    except (OSError, subprocess.SubprocessError):
        return {"revision": None, "dirty": None}
    return {"revision": head.strip(), "dirty": bool(status.strip())}


def _git(directory: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=directory, capture_output=True, text=True, timeout=30, check=True
    )
    return done.stdout


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _check_number(what: str, number: float) -> None:
    if isinstance(number, bool) or not isinstance(number, int | float) or not math.isfinite(number):
        raise ValueError(f"{what} must be a finite number, got {number!r}")
