"""``OffmetaPolicy``: the MLflow ``pyfunc`` model of a mirrored version, over the consumer API.

The model's artifacts are the version's ``learner_state`` files and its ``manifest.json``;
``load_context`` checks both files against the manifest's digests and rebuilds the learner with
``pipeline.consumer.learner_from_files``, the same code ``load_learner`` runs. Then::

    model = mlflow.pyfunc.load_model("models:/NAME@latest")
    model.predict(obs)                                   # [B, obs_dim] -> [B, action_dim]
    model.predict({"obs": obs, "support_obs": s_obs, "support_actions": s_actions})
    model.predict(obs, params={"module_id": "critic"})   # another module

A dict input adapts the meta-parameters to the support rows (``learner.adapt``, the training
inner rule and steps) and predicts ``obs`` with the adapted parameters; each ``support_<column>``
key is a column of the support rows, and the algorithm's own columns are required (MACAW adds
``support_returns``; the context learner the columns its encoder reads, such as
``support_rewards`` and ``support_new_obs``). An array is predicted with the meta-parameters.
``model.unwrap_python_model().learner`` is the ``MetaLearner`` itself, for everything else the
consumer API offers (``adapt`` with other steps, ``predict``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mlflow.pyfunc
import numpy as np
import torch

from learners.config import DEFAULT_MODULE_ID
from learners.meta.learner import MetaLearner
from pipeline.artifacts.errors import IntegrityError
from pipeline.consumer import LEARNER_JSON, LEARNER_TENSORS, learner_from_files, predict

MANIFEST = "manifest.json"
MODEL_CODE = """
from mlflow.models import set_model

from pipeline.mlflow.pyfunc_model import OffmetaPolicy

set_model(OffmetaPolicy())
"""
"""The model as code (``log_model(python_model=<this file>)``), so that loading it unpickles
nothing: MLflow runs this file, which needs offmeta importable where the model is loaded."""
ARTIFACT_FILES = (LEARNER_TENSORS, LEARNER_JSON, MANIFEST)
"""The files of a version the model carries (each under its own name as the artifact key)."""
SUPPORT_PREFIX = "support_"


class OffmetaPolicy(mlflow.pyfunc.PythonModel):
    """A published learner as an MLflow ``pyfunc`` model (see the module docstring)."""

    learner: MetaLearner
    spec: str

    def load_context(self, context: mlflow.pyfunc.PythonModelContext) -> None:
        """Rebuild the learner from the model's artifacts, verified against the manifest."""
        paths = {name: Path(context.artifacts[name]) for name in ARTIFACT_FILES}
        manifest = json.loads(paths[MANIFEST].read_bytes())
        self.spec = f"{manifest['name']}:{manifest['version']}"
        contents = {}
        for name in (LEARNER_TENSORS, LEARNER_JSON):
            data = paths[name].read_bytes()
            expected = manifest["files"][name]["digest"]
            found = "sha256:" + hashlib.sha256(data).hexdigest()
            if found != expected:
                raise IntegrityError(
                    [
                        f"{self.spec} model file {name!r} is corrupt: expected digest {expected}, "
                        f"found {found}"
                    ]
                )
            contents[name] = data
        self.learner = learner_from_files(
            contents[LEARNER_TENSORS],
            contents[LEARNER_JSON],
            where=f"{self.spec} learner state (MLflow model)",
        )

    # model_input has no annotation: MLflow reads one as an input schema to enforce, and the
    # input here is an array, a DataFrame or the support dict alike.
    def predict(
        self,
        context: mlflow.pyfunc.PythonModelContext | None,
        model_input,
        params: Mapping[str, Any] | None = None,
    ) -> np.ndarray | dict[str, np.ndarray]:
        """Actions for ``model_input``: observations ``[B, obs_dim]`` (array, DataFrame or list),
        or ``{"obs", "support_obs", "support_actions", ...}`` to adapt on the support rows
        first. ``params={"module_id": ...}`` picks the module (default ``default_policy``)."""
        module_id = str((params or {}).get("module_id", DEFAULT_MODULE_ID))
        adapted = None
        if isinstance(model_input, Mapping):
            columns = ("obs", "actions", *self.learner.config.sample_columns)
            needed = ["obs", *(SUPPORT_PREFIX + column for column in dict.fromkeys(columns))]
            missing = [key for key in needed if key not in model_input]
            if missing:
                raise ValueError(
                    f"a dict input to {self.spec} needs the keys {', '.join(needed[:-1])} and "
                    f"{needed[-1]}; missing: {', '.join(missing)} (pass an array of "
                    "observations alone to predict with the meta-parameters)"
                )
            support = {
                key.removeprefix(SUPPORT_PREFIX): self._tensor(
                    value, module_id, actions=key == SUPPORT_PREFIX + "actions"
                )
                for key, value in model_input.items()
                if key.startswith(SUPPORT_PREFIX)
            }
            adapted = self.learner.adapt(None, {module_id: support})
            obs = self._tensor(model_input["obs"], module_id)
        else:
            obs = self._tensor(model_input, module_id)
        output = predict(self.learner, obs, module_id=module_id, params=adapted)
        if isinstance(output, dict):
            return {key: value.cpu().numpy() for key, value in output.items()}
        return output.cpu().numpy()

    def _tensor(self, value: Any, module_id: str, *, actions: bool = False) -> torch.Tensor:
        """``value`` as a tensor on the device of ``module_id``'s parameters, floats in their
        dtype, integer actions (discrete) kept as int64."""
        array = np.asarray(value.to_numpy() if hasattr(value, "to_numpy") else value)
        if module_id not in self.learner.meta_params:
            modules = list(self.learner.config.modules)
            raise KeyError(f"module {module_id!r} is not one of the learner's modules {modules}")
        reference = next(iter(self.learner.meta_params[module_id].values()))
        tensor = torch.as_tensor(array, device=reference.device)
        if actions and not tensor.is_floating_point():
            return tensor.long()
        return tensor.to(reference.dtype)
