"""Storage every node of the Ray cluster reaches: where Ray Train keeps a run's checkpoints,
the check that refuses local paths on a cluster of several nodes, and the failures of
workers that say the cluster is set up wrong.

Ray Train's workers write their checkpoints to the run's storage themselves, so on a
cluster of more than one node a local path of the head fails at the first checkpoint a
worker on another node reports (Ray Train's rule: cloud storage or a shared filesystem).
``check_reachable`` says so before anything is read or trained; ``ray_storage`` turns the
run directory (a path, or ``s3://``: ``flows.runs.run_storage``) into Ray Train's
``storage_path`` and ``storage_filesystem`` (the datasets' S3 filesystem,
``pipeline.io.s3``, whose endpoint and keys travel with it to the workers);
``cluster_error`` turns a worker's storage or import failure into one permanent line.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flows.config import MetaTrainConfig
from flows.runs.retry_policy import ClusterSetupError
from flows.runs.run_storage import is_s3

_OFFMETA_PACKAGES = ("flows", "pipeline", "learners")
_RAY_STORAGE_FAILURE = "Unable to set up cluster storage"


def ray_storage(run_dir: str | Path) -> tuple[str, Any]:
    """Ray Train's ``storage_path`` for the run directory ``run_dir`` and its
    ``storage_filesystem`` (None for a local path)."""
    if is_s3(run_dir):
        from pipeline.io.s3 import s3_filesystem

        filesystem, path = s3_filesystem(str(run_dir))
        return f"{path}/ray", filesystem
    return str(Path(run_dir).resolve() / "ray"), None


def alive_nodes() -> int:
    """Nodes of the running Ray cluster that are alive."""
    import ray

    return sum(1 for node in ray.nodes() if node.get("Alive"))


def check_reachable(cfg: MetaTrainConfig, nodes: int) -> None:
    """``ValueError`` naming the fix when the cluster has more than one node and the run's
    storage (Ray Train runs only) or a dataset is a local path that ``training.
    shared_filesystem`` does not declare shared."""
    if nodes <= 1 or cfg.training.shared_filesystem:
        return
    local = [
        f"{name}={value!r}"
        for name, value in (("data.train", cfg.data.train), ("data.heldout", cfg.data.heldout))
        if not is_s3(value)
    ]
    if cfg.learners.num_learners > 0 and not is_s3(cfg.training.checkpoint_dir):
        local.insert(0, f"training.checkpoint_dir={cfg.training.checkpoint_dir!r}")
    if local:
        raise ValueError(
            f"the Ray cluster has {nodes} nodes, but {', '.join(local)} "
            f"{'is a local path' if len(local) == 1 else 'are local paths'} that the other "
            "nodes may not see; set training.checkpoint_dir=s3://BUCKET/PREFIX (and s3:// "
            "datasets), or training.shared_filesystem=true if every node mounts these paths"
        )


def cluster_error(failures: Iterable[BaseException], storage: str) -> ClusterSetupError | None:
    """The one-line permanent error for workers that failed because the run's ``storage``
    (its URI or directory) or offmeta itself was out of their reach; None for other
    failures."""
    for failure in failures:
        missing = _missing_offmeta(failure)
        if missing is not None:
            return ClusterSetupError(
                f"a Ray Train worker cannot import offmeta ({missing}); install offmeta on "
                "every node, or ship it with ray.runtime_env (e.g. {working_dir: ., "
                "excludes: [runs, artifacts]}: docs/run-storage.md)"
            )
        if _RAY_STORAGE_FAILURE in str(failure) or isinstance(failure, OSError):
            reason = " ".join(str(failure).split())[:200]
            return ClusterSetupError(
                f"a Ray Train worker could not write the run's checkpoints to {storage} "
                f"({type(failure).__name__}: {reason}); every node must reach it: set "
                "training.checkpoint_dir=s3://BUCKET/PREFIX or a path on a filesystem every "
                "node mounts (training.shared_filesystem=true)"
            )
    return None


def _missing_offmeta(failure: BaseException | None) -> str | None:
    """``No module named 'flows'`` (say) when ``failure``, or an error it came from, is
    offmeta's code missing on a node."""
    seen = 0
    while failure is not None and seen < 8:
        name = failure.name if isinstance(failure, ModuleNotFoundError) else None
        if name is not None and name.split(".")[0] in _OFFMETA_PACKAGES:
            return f"No module named {name!r}"
        text = str(failure)
        for package in _OFFMETA_PACKAGES:
            if f"No module named '{package}" in text:
                name = text.split("No module named '", 1)[1].split("'", 1)[0]
                return f"No module named {name!r}"
        failure = failure.__cause__ or failure.__context__
        seen += 1
    return None
