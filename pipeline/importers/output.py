"""What an import promises about its output: a new or empty directory refused otherwise
before anything is read, and the ``ImportSummary`` it returns (the rows are written by
``pipeline.writes.writer``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.reads.episodes import DatasetInfo


@dataclass(frozen=True)
class SourceFacts:
    """What only the importer knows about the source it read."""

    source_rows: int
    """Rows read from the source, before dropping duplicates or padding rows."""
    duplicate_rows: int
    """Exact repeats of a recorded step, kept once (RLlib's recorder rewrites steps)."""
    padding_rows: int
    """Rows that are not transitions (Minari's last row of each episode)."""
    source_fingerprint: str


@dataclass(frozen=True)
class ImportSummary:
    """What an import read and wrote."""

    out: str
    """The dataset directory written."""
    rows: int
    episodes: int
    files: int
    tasks: tuple[str, ...]
    modules: tuple[str, ...]
    fingerprint: str
    """The written dataset's fingerprint (as ``read_episodes`` computes it)."""
    source_rows: int
    """Rows read from the source, before dropping duplicates or padding rows."""
    duplicate_rows: int
    """Exact repeats of a recorded step, kept once (RLlib's recorder rewrites steps)."""
    padding_rows: int
    """Rows that are not transitions (Minari's last row of each episode)."""
    source_fingerprint: str

    def line(self) -> str:
        """One line for logs and the CLI."""
        dropped = []
        if self.duplicate_rows:
            dropped.append(f"{self.duplicate_rows} duplicate rows")
        if self.padding_rows:
            dropped.append(f"{self.padding_rows} padding rows")
        note = f", dropped {' and '.join(dropped)}" if dropped else ""
        return (
            f"imported {self.rows} rows, {self.episodes} episodes, {len(self.tasks)} task(s), "
            f"{len(self.modules)} module(s) from {self.source_rows} source rows{note} into "
            f"{self.out} ({self.files} file(s), fingerprint {self.fingerprint[:12]})"
        )


def check_output(out: Path) -> None:
    """Refuse an output directory that already holds files, before anything is read."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(
            f"{out} already exists and is not an empty directory; expected a new or empty "
            "directory for the imported dataset (delete it or choose another --out)"
        )


def import_summary(info: DatasetInfo, source: SourceFacts) -> ImportSummary:
    """What an import wrote (``info``: the published dataset) and read (``source``)."""
    return ImportSummary(
        out=info.root,
        rows=info.num_rows,
        episodes=info.num_episodes,
        files=len(info.files),
        tasks=info.task_ids,
        modules=info.module_ids,
        fingerprint=info.fingerprint,
        source_rows=source.source_rows,
        duplicate_rows=source.duplicate_rows,
        padding_rows=source.padding_rows,
        source_fingerprint=source.source_fingerprint,
    )
