"""The registered model of a mirrored version, loaded in a fresh process with
``mlflow.pyfunc.load_model("models:/NAME@latest")``, predicts what ``load_learner`` predicts:
before adaptation, after adaptation on support rows, and for another module; for the context
learner, after encoding support transitions (rewards and next observations among them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from pipeline.artifacts import ArtifactStore
from pipeline.mlflow.mirror import MlflowTarget, mirror
from tests.helpers.mlflow_server import MlflowServer
from tests.helpers.paths import REPO
from tests.pipeline.mlflow.test_mirror import publish

pytestmark = pytest.mark.timeout(240)

# Runs in a fresh interpreter: the model comes from the server alone, the reference from the
# offmeta store through the consumer API.
_ROUND_TRIP = textwrap.dedent(
    """
    import json, sys
    import mlflow, numpy as np, torch
    from pipeline.consumer import load_learner, predict

    uri, name, context_name, root = sys.argv[1:5]
    mlflow.set_tracking_uri(uri)
    model = mlflow.pyfunc.load_model(f"models:/{name}@latest")
    learner = load_learner(f"{name}@latest", root=root)
    obs = np.linspace(-1, 1, 10, dtype=np.float32).reshape(5, 2)
    support_obs = np.linspace(0, 1, 12, dtype=np.float32).reshape(6, 2)
    support_actions = np.sin(3 * support_obs)
    adapted = learner.adapt(
        None,
        {"default_policy": {"obs": torch.from_numpy(support_obs),
                            "actions": torch.from_numpy(support_actions)}},
    )
    critic = model.predict(obs, params={"module_id": "critic"})
    found = {
        "meta": model.predict(obs).tolist(),
        "adapted": model.predict(
            {"obs": obs, "support_obs": support_obs, "support_actions": support_actions}
        ).tolist(),
        "critic": {key: value.tolist() for key, value in critic.items()},
        "spec": model.unwrap_python_model().spec,
    }
    expected = {
        "meta": predict(learner, torch.from_numpy(obs)).tolist(),
        "adapted": predict(learner, torch.from_numpy(obs), params=adapted).tolist(),
        "critic": {
            key: value.tolist()
            for key, value in predict(learner, torch.from_numpy(obs), module_id="critic").items()
        },
        "spec": f"{name}:2",
    }

    # The context learner: its support rows carry what its encoder reads.
    model = mlflow.pyfunc.load_model(f"models:/{context_name}@latest")
    learner = load_learner(f"{context_name}@latest", root=root)
    support = {
        "obs": support_obs,
        "actions": support_actions,
        "rewards": -np.abs(support_obs).sum(1),
        "new_obs": support_obs + 0.1,
    }
    adapted = learner.adapt(
        None, {"default_policy": {k: torch.from_numpy(v) for k, v in support.items()}}
    )
    given = {"obs": obs, **{f"support_{k}": v for k, v in support.items()}}
    found["context"] = [model.predict(obs).tolist(), model.predict(given).tolist()]
    expected["context"] = [
        predict(learner, torch.from_numpy(obs)).tolist(),
        predict(learner, torch.from_numpy(obs), params=adapted).tolist(),
    ]
    print(json.dumps({"found": found, "expected": expected}))
    """
)
CONTEXT_CONFIG = {
    "algorithm": "context",
    "context": {"latent_dim": 3},
    "modules": {
        "default_policy": {"obs_dim": 2, "action_dim": 2, "model": {"hidden_sizes": [8]}},
        "encoder": {"obs_dim": 7, "action_dim": 3, "model": {"hidden_sizes": [8]}},
    },
}


def test_the_registered_model_predicts_what_load_learner_predicts_in_a_fresh_process(
    mlflow_tracking: MlflowServer, tmp_path: Path
) -> None:
    store = ArtifactStore(tmp_path / "store", durable=False)
    name = f"pyfunc-{uuid.uuid4().hex[:8]}"
    publish(store, name, seed=0)
    publish(store, name, seed=1)
    mirror(store, name, MlflowTarget(mlflow_tracking.uri, "pyfunc-tests", name))
    context_name = f"{name}-context"
    publish(store, context_name, seed=2, config=CONTEXT_CONFIG)
    mirror(store, context_name, MlflowTarget(mlflow_tracking.uri, "pyfunc-tests", context_name))
    command = [sys.executable, "-c", _ROUND_TRIP, mlflow_tracking.uri, name, context_name]
    result = subprocess.run(
        [*command, str(store.root)],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["found"] == answer["expected"]
    assert answer["found"]["meta"] != answer["found"]["adapted"]
    assert answer["found"]["context"][0] != answer["found"]["context"][1]


def test_a_dict_input_without_support_rows_is_refused(
    mlflow_tracking: MlflowServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow

    store = ArtifactStore(tmp_path / "store", durable=False)
    name = f"pyfunc-{uuid.uuid4().hex[:8]}"
    publish(store, name)
    mirror(store, name, MlflowTarget(mlflow_tracking.uri, "pyfunc-tests", name))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_tracking.uri)
    model = mlflow.pyfunc.load_model(f"models:/{name}/1")
    with pytest.raises(ValueError) as refused:
        model.predict({"obs": [[0.0, 1.0]], "support_obs": [[0.0, 1.0]]})
    assert str(refused.value) == (
        f"a dict input to {name}:1 needs the keys obs, support_obs and support_actions; "
        "missing: support_actions (pass an array of observations alone to predict with the "
        "meta-parameters)"
    )
    context = f"{name}-context"
    publish(store, context, config=CONTEXT_CONFIG)
    mirror(store, context, MlflowTarget(mlflow_tracking.uri, "pyfunc-tests", context))
    model = mlflow.pyfunc.load_model(f"models:/{context}/1")
    with pytest.raises(ValueError) as refused:
        model.predict(
            {"obs": [[0.0, 1.0]], "support_obs": [[0.0, 1.0]], "support_actions": [[0.0, 1.0]]}
        )
    assert str(refused.value) == (
        f"a dict input to {context}:1 needs the keys obs, support_obs, support_actions, "
        "support_rewards and support_new_obs; missing: support_rewards, support_new_obs (pass "
        "an array of observations alone to predict with the meta-parameters)"
    )
