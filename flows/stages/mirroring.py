"""Stage 5 of a run with ``artifacts.mlflow`` set: mirror the published version to MLflow.

The offmeta version is committed before this stage starts and nothing here can undo it: an
MLflow outage is tried ``artifacts.mlflow.attempts`` times, then reported (a log line, the
Prefect report and ``offmeta run``'s last line) as *not mirrored*, with the command that
backfills it later; the run still succeeds. ``pipeline.mlflow.mirror`` does the mirroring.
"""

from __future__ import annotations

import logging
import shlex
import time
from dataclasses import dataclass

from flows.config import MetaTrainConfig
from pipeline.artifacts import ArtifactRef, ArtifactStore


@dataclass(frozen=True)
class MirrorOutcome:
    """How the mirror of one published version went."""

    spec: str
    """offmeta ``name:version``."""
    mirrored: bool
    detail: str
    """What MLflow now holds (``MirrorResult.summary``), or the last error."""
    attempts: int
    backfill: str
    """The command that mirrors the version later."""

    def line(self) -> str:
        """One line for the log and ``offmeta run``."""
        if self.mirrored:
            return f"mirrored to MLflow: {self.detail}"
        tries = f"{self.attempts} attempt{'s' * (self.attempts != 1)}"
        return (
            f"not mirrored to MLflow: {self.spec} is published in offmeta, but the mirror failed "
            f"after {tries} ({self.detail}); backfill it with: {self.backfill}"
        )


def mirror_published(
    cfg: MetaTrainConfig, ref: ArtifactRef, *, logger: logging.Logger | logging.LoggerAdapter
) -> MirrorOutcome:
    """Mirror ``ref`` (and the unmirrored versions before it) to ``cfg.artifacts.mlflow``,
    retrying; never raises for what MLflow or its client does."""
    settings = cfg.artifacts.mlflow
    if settings is None:
        raise ValueError("mirror_published needs artifacts.mlflow in the config")
    registered_model = cfg.artifacts.registered_model or cfg.artifacts.name
    command = ["offmeta", "artifacts", "mirror", str(ref), "--to", "mlflow"]
    command += ["--root", cfg.artifacts.root, "--experiment", settings.experiment]
    command += ["--registered-model", registered_model]
    command += ["--tracking-uri", settings.tracking_uri] if settings.tracking_uri else []
    backfill = shlex.join(command)
    detail, attempt = "", 0
    for attempt in range(1, settings.attempts + 1):
        try:
            from pipeline.mlflow.mirror import MirrorError, MlflowTarget, mirror

            target = MlflowTarget.resolve(
                settings.tracking_uri, settings.experiment, registered_model
            )
            result = mirror(ArtifactStore(cfg.artifacts.root), str(ref), target)
        except ModuleNotFoundError as error:
            detail = f"{error}; install the client with: pip install 'offmeta[mlflow]'"
            break
        except MirrorError as error:
            detail = str(error)  # the same request would be refused again
            break
        except Exception as error:  # an MLflow outage in any shape: the publish stands
            detail = f"{type(error).__name__}: {_first_line(error)}"
            logger.warning(
                "mirror of %s to MLflow, attempt %d of %d, failed: %s",
                ref,
                attempt,
                settings.attempts,
                detail,
            )
            if attempt < settings.attempts:
                time.sleep(settings.retry_delay_s)
        else:
            outcome = MirrorOutcome(str(ref), True, result.summary(), attempt, backfill)
            logger.info("%s", outcome.line())
            return outcome
    outcome = MirrorOutcome(str(ref), False, detail, attempt, backfill)
    logger.error("%s", outcome.line())
    return outcome


def mirror_markdown(outcome: MirrorOutcome, tracking_uri: str | None) -> str:
    """The Prefect report of the mirror."""
    server = tracking_uri or "$MLFLOW_TRACKING_URI"
    if outcome.mirrored:
        return "\n".join(
            [
                f"# {outcome.spec} in MLflow",
                "",
                f"Mirrored to the MLflow server `{server}`: {outcome.detail}.",
            ]
        )
    return "\n".join(
        [
            f"# {outcome.spec}: not mirrored to MLflow",
            "",
            f"The version is published in the offmeta store (the source of truth); the mirror "
            f"to `{server}` failed after {outcome.attempts} attempt(s): {outcome.detail}",
            "",
            f"Backfill it (idempotent) with `{outcome.backfill}`.",
        ]
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "(no message)"
