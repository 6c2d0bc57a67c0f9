"""Mirror offmeta versions into MLflow: one run and one registered model version each.

For ``NAME:V`` the mirror reads everything from the offmeta store (so a backfill gives what a
mirror at publish time gives) and creates, in the target's experiment:

- a run named ``NAME:V`` with the config as flattened params (``learners.inner.lr``), the
  learning curve as step-wise metrics (step = meta-iteration), the manifest's metrics, the
  pictures and their data under ``pictures/``, the manifest, evaluation and history under
  ``offmeta/``, and the lineage as ``offmeta.*`` tags;
- a version of the registered model whose model is ``OffmetaPolicy`` (``pyfunc_model``),
  created with the tags ``offmeta.name``, ``offmeta.version`` and ``offmeta.digest`` in the
  same request, so a version exists in MLflow exactly when it carries them.

Idempotent: a version already in the registry (found by those tags) is left as it is; a run
of an earlier attempt that never got its version is deleted before the new one is made.

MLflow numbers its own versions and reserves the alias ``latest`` for its highest version
number. So that ``models:/NAME@latest`` is offmeta's latest, versions are registered in
offmeta's order: mirroring ``NAME:V`` first mirrors the unmirrored versions before it, and an
unmirrored version older than a mirrored one is refused. Every other offmeta alias is set on
the MLflow version of its target (``mirror_aliases``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.artifacts import ArtifactError, ArtifactStore, Manifest
from pipeline.artifacts.records.names import parse_spec
from pipeline.consumer import LEARNER_JSON, LEARNER_TENSORS

if TYPE_CHECKING:
    from mlflow import MlflowClient

TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
VERSION_TAG = "offmeta.version"
NAME_TAG = "offmeta.name"
DIGEST_TAG = "offmeta.digest"
SPEC_TAG = "offmeta.spec"
MODEL_NAME = "model"
"""Name of the logged pyfunc model in each run."""
_RUN_FILES = ("manifest.json", "evaluation.json", "history.json", "config.json", "metrics.json")
_PARAM_KEY = re.compile(r"[^\w\-. /]")
_MLFLOW_ALIAS = re.compile(r"[\w\-]+")
_BATCH = 100
"""Params or metrics per ``log_batch`` request (MLflow takes at most 100 params)."""
_MAX_PARAM_VALUE = 6000


class MirrorError(ArtifactError):
    """A version cannot be mirrored as asked (the MLflow server's own errors pass through)."""


@dataclass(frozen=True)
class MlflowTarget:
    """Where versions are mirrored: a tracking server, an experiment and a registered model."""

    tracking_uri: str
    experiment: str
    registered_model: str

    @classmethod
    def resolve(
        cls, tracking_uri: str | None, experiment: str, registered_model: str
    ) -> MlflowTarget:
        """The target, with the URI from ``MLFLOW_TRACKING_URI`` when ``tracking_uri`` is None."""
        uri = tracking_uri or os.environ.get(TRACKING_URI_ENV)
        if not uri:
            raise MirrorError(
                f"no MLflow tracking URI: set artifacts.mlflow.tracking_uri (or --tracking-uri) "
                f"or the {TRACKING_URI_ENV} environment variable"
            )
        return cls(uri, experiment, registered_model)


@dataclass(frozen=True)
class MirroredVersion:
    """One offmeta version and the MLflow registered model version that mirrors it."""

    spec: str
    """offmeta ``name:version``."""
    registered_model: str
    mlflow_version: str
    run_id: str
    created: bool
    """False when an earlier mirror had already registered it."""


@dataclass(frozen=True)
class MirrorResult:
    """What one ``mirror`` call found and did."""

    versions: list[MirroredVersion]
    aliases: dict[str, str] = field(default_factory=dict)
    """offmeta alias -> MLflow version it now names (``latest`` is MLflow's own)."""
    skipped_aliases: dict[str, str] = field(default_factory=dict)
    """offmeta alias -> why MLflow cannot hold it."""

    def summary(self) -> str:
        """One line: which offmeta versions are which MLflow versions, and the aliases."""
        if not self.versions:
            return "nothing to mirror"
        model = self.versions[0].registered_model
        parts = [
            f"{v.spec} -> {model} version {v.mlflow_version}"
            + ("" if v.created else " (already mirrored)")
            for v in self.versions
        ]
        aliases = ", ".join(f"@{a} -> {v}" for a, v in self.aliases.items())
        skipped = ", ".join(f"@{a} ({why})" for a, why in self.skipped_aliases.items())
        return "; ".join(
            [
                *parts,
                *([f"aliases {aliases}"] if aliases else []),
                *([f"not mirrored {skipped}"] if skipped else []),
            ]
        )


def mirror(store: ArtifactStore, spec: str, target: MlflowTarget) -> MirrorResult:
    """Mirror ``spec`` (``NAME:V``, ``NAME@ALIAS``) and the unmirrored versions before it, or
    with a bare ``NAME`` every version; then set the aliases (``mirror_aliases``)."""
    from mlflow import MlflowClient

    parsed = parse_spec(spec)
    every = "@" not in spec and ":" not in spec
    if every:
        versions = store.list_versions(parsed.name)
        if not versions:
            store.get(parsed.name)  # raises the not-found error naming the known artifacts
        upto = versions[-1]
    else:
        upto = store.get(spec).version
    client = MlflowClient(tracking_uri=target.tracking_uri, registry_uri=target.tracking_uri)
    mirrored = mirrored_versions(client, target.registered_model, parsed.name)
    done = [
        _existing(parsed.name, version, target, found)
        for version, found in sorted(mirrored.items())
        if every or version == upto
    ]
    newest = max(mirrored, default=0)
    if upto not in mirrored and upto < newest:
        raise MirrorError(
            f"refusing to mirror {parsed.name}:{upto}: {parsed.name}:{newest} is already "
            f"{target.registered_model} version {mirrored[newest][0]}, and MLflow's @latest "
            "is its highest version number, so a version registered now would become "
            f"{target.registered_model}@latest; versions are mirrored oldest first"
        )
    # MLflow prints "View run ... at: URL" and registration notes to stdout: they go to stderr
    # here, so that stdout carries only what the caller prints (a CLI's table or JSON).
    with contextlib.redirect_stdout(sys.stderr):
        for version in store.list_versions(parsed.name):
            if newest < version <= upto:
                done.append(_mirror_one(client, store, store.get(parsed.name, version), target))
    aliases, skipped = mirror_aliases(store, parsed.name, target, client=client)
    return MirrorResult(done, aliases, skipped)


def mirrored_versions(
    client: MlflowClient, registered_model: str, name: str
) -> dict[int, tuple[str, str]]:
    """``{offmeta version: (MLflow version, run id)}`` of ``name`` in ``registered_model``."""
    found: dict[int, tuple[str, str]] = {}
    for version in client.search_model_versions(f"name = '{_quoted(registered_model)}'"):
        tags = version.tags or {}
        if tags.get(NAME_TAG) == name and (number := tags.get(VERSION_TAG, "")).isdigit():
            found.setdefault(int(number), (str(version.version), version.run_id or ""))
    return found


def mirror_aliases(
    store: ArtifactStore, name: str, target: MlflowTarget, *, client: MlflowClient
) -> tuple[dict[str, str], dict[str, str]]:
    """Point each MLflow alias at the MLflow version of its offmeta target; returns the aliases
    set and those skipped with the reason (an MLflow-reserved name, or an unmirrored target)."""
    mirrored = mirrored_versions(client, target.registered_model, name)
    aliases: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for alias, version in store.aliases(name).items():
        if alias == "latest":
            if mirrored:
                aliases[alias] = mirrored[max(mirrored)][0]
            continue
        if not _MLFLOW_ALIAS.fullmatch(alias) or re.fullmatch(r"[vV]\d+", alias):
            skipped[alias] = "MLflow aliases are letters, digits, '_' and '-', and not v<N>"
        elif version not in mirrored:
            skipped[alias] = f"{name}:{version} is not mirrored"
        else:
            mlflow_version = mirrored[version][0]
            client.set_registered_model_alias(target.registered_model, alias, mlflow_version)
            aliases[alias] = mlflow_version
    return aliases, skipped


def _existing(
    name: str, version: int, target: MlflowTarget, found: tuple[str, str]
) -> MirroredVersion:
    return MirroredVersion(f"{name}:{version}", target.registered_model, *found, created=False)


def _mirror_one(
    client: MlflowClient, store: ArtifactStore, manifest: Manifest, target: MlflowTarget
) -> MirroredVersion:
    """Create the run and the registered model version of one unmirrored offmeta version."""
    import mlflow

    from pipeline.mlflow.pyfunc_model import ARTIFACT_FILES, MODEL_CODE

    missing = [f for f in (LEARNER_TENSORS, LEARNER_JSON) if f not in manifest.files]
    if missing:
        raise MirrorError(
            f"{manifest.spec} holds no learner state (no {', '.join(missing)}), which the MLflow "
            "model is made of; only versions that offmeta run published can be mirrored"
        )
    experiment_id = _experiment_id(client, target.experiment)
    for run in client.search_runs(
        [experiment_id], f"tags.`{SPEC_TAG}` = '{_quoted(manifest.spec)}'"
    ):
        client.delete_run(run.info.run_id)  # an earlier attempt that registered no version
    run = client.create_run(experiment_id, run_name=manifest.spec, tags=_run_tags(store, manifest))
    run_id = run.info.run_id
    with tempfile.TemporaryDirectory(prefix="offmeta-mlflow-") as scratch:
        exported = Path(scratch) / "version"
        store.export(manifest, exported)
        _log_run(client, run_id, manifest, exported)
        model_code = Path(scratch) / "offmeta_policy.py"
        model_code.write_text(MODEL_CODE)
        model_dir = Path(scratch) / MODEL_NAME
        with warnings.catch_warnings():
            # MLflow suggests an input example and type hints: the input has no fixed schema.
            warnings.filterwarnings("ignore", category=UserWarning, module=r"mlflow\.")
            # Saved here and uploaded with the client, not log_model: the fluent API would set
            # the process's global tracking URI (and MLFLOW_TRACKING_URI) to the target's.
            mlflow.pyfunc.save_model(
                path=model_dir,
                python_model=str(model_code),
                artifacts={file: str(exported / file) for file in ARTIFACT_FILES},
                signature=_signature(),
                pip_requirements=_requirements(),
            )
        client.log_artifacts(run_id, str(model_dir), MODEL_NAME)
    client.set_terminated(run_id)
    _ensure_registered_model(client, target.registered_model)
    # The tags come with the version in one request: a version without them never exists.
    version = client.create_model_version(
        target.registered_model,
        f"{run.info.artifact_uri}/{MODEL_NAME}",
        run_id=run_id,
        tags={
            NAME_TAG: manifest.name,
            VERSION_TAG: str(manifest.version),
            DIGEST_TAG: manifest.params_digest,
        },
        description=_description(store, manifest),
    )
    return MirroredVersion(
        manifest.spec, target.registered_model, str(version.version), run_id, created=True
    )


def _log_run(client: MlflowClient, run_id: str, manifest: Manifest, exported: Path) -> None:
    """Params, metrics and artifacts (the model aside) of the run."""
    from mlflow.entities import Metric, Param

    timestamp = int(manifest.created_at.timestamp() * 1000)
    params = [Param(key, value) for key, value in flatten_config(manifest.config).items()]
    metrics = [
        Metric(key, float(value), timestamp, 0)
        for key, value in manifest.metrics.items()
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ]
    history_file = exported / "history.json"
    if history_file.exists():
        history = json.loads(history_file.read_text())
        steps = history.get("iteration") or list(range(len(next(iter(history.values()), []))))
        for key, values in history.items():
            if key == "iteration":
                continue
            metrics += [
                Metric(key, float(value), timestamp, int(step))
                for step, value in zip(steps, values, strict=False)
                if value is not None and math.isfinite(value)
            ]
    for start in range(0, len(params), _BATCH):
        client.log_batch(run_id, params=params[start : start + _BATCH])
    for start in range(0, len(metrics), 10 * _BATCH):
        client.log_batch(run_id, metrics=metrics[start : start + 10 * _BATCH])
    for path in sorted(exported.iterdir()):
        if path.suffix == ".png" or (path.suffix == ".json" and path.with_suffix(".png").exists()):
            client.log_artifact(run_id, str(path), "pictures")
        elif path.name in _RUN_FILES:
            client.log_artifact(run_id, str(path), "offmeta")


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"learners.inner.lr": "0.5", ...}``: nested keys joined by dots, lists as JSON, keys
    made of the characters MLflow takes, values cut at MLflow's 6,000 characters."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        path = _PARAM_KEY.sub("_", f"{prefix}{key}")
        if isinstance(value, Mapping) and value:
            flat.update(flatten_config(value, f"{path}."))
        else:
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
            flat[path] = text[:_MAX_PARAM_VALUE]
    return flat


def _run_tags(store: ArtifactStore, manifest: Manifest) -> dict[str, str]:
    lineage = manifest.lineage
    tags = {
        SPEC_TAG: manifest.spec,
        NAME_TAG: manifest.name,
        VERSION_TAG: str(manifest.version),
        DIGEST_TAG: manifest.params_digest,
        "offmeta.store": str(store.root),
        "offmeta.created_at": manifest.created_at.isoformat(),
        "mlflow.note.content": _description(store, manifest),
    }
    facts = {
        "dataset_fingerprint": lineage.dataset_fingerprint,
        "heldout_fingerprint": lineage.extras.get("heldout_fingerprint"),
        "parent": lineage.parent,
        "flow_run_id": lineage.flow_run_id,
        "code_version": lineage.code_version,
        "weights_seq_no": lineage.weights_seq_no,
    }
    tags.update({f"offmeta.{k}": str(v) for k, v in facts.items() if v is not None})
    return tags


def _description(store: ArtifactStore, manifest: Manifest) -> str:
    return (
        f"offmeta version `{manifest.spec}` (params digest `{manifest.params_digest}`) from the "
        f"artifact store `{store.root}`, which stays its source of truth. Load the learner from "
        f"there with `pipeline.consumer.load_learner({manifest.spec!r}, root={str(store.root)!r})`."
    )


def _experiment_id(client: MlflowClient, name: str) -> str:
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    try:
        return client.create_experiment(name)
    except MlflowException:
        # Another mirror created it between the two calls.
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


def _signature() -> Any:
    """No input schema (arrays, DataFrames and the support dict all pass); ``module_id`` as
    a params entry, which MLflow only hands to ``predict`` when the signature declares it."""
    from mlflow.models import ModelSignature
    from mlflow.types import ParamSchema, ParamSpec

    from learners.config import DEFAULT_MODULE_ID

    return ModelSignature(params=ParamSchema([ParamSpec("module_id", "string", DEFAULT_MODULE_ID)]))


def _requirements() -> list[str]:
    import torch

    offmeta = metadata.version("offmeta")
    return [f"offmeta[mlflow]=={offmeta}", f"torch=={torch.__version__.split('+')[0]}"]


def _ensure_registered_model(client: MlflowClient, name: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException:
        with contextlib.suppress(MlflowException):  # another mirror created it meanwhile
            client.create_registered_model(name)


def _quoted(text: str) -> str:
    return text.replace("'", "\\'")
