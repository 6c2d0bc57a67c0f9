"""``offmeta run`` / ``offmeta serve`` arguments, and serving a deployment on a cron schedule:
the deployment is registered with its cron, a triggered run completes, and the serving
process stops cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas.responses import DeploymentResponse

from flows.cli import main
from tests.helpers.flow_runs import tiny_document, tiny_point_robot, write_config
from tests.helpers.paths import REPO

SERVE_TIMEOUT_S = 240
SAMPLES = REPO / "data" / "samples"
# Runs `offmeta ARGS` (the console script's `main`) and prints which of Ray and Prefect the
# process imported: a run refused before they start has imported neither.
PROBE = """
import sys
from flows.cli import main
status = main(sys.argv[1:])
print(sorted({name.split(".")[0] for name in sys.modules} & {"ray", "prefect"}))
sys.exit(status)
"""


def _offmeta_probe(args: list[str], cwd: Path, env: dict[str, str] | None = None):
    return subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_run_refuses_an_invalid_config_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path / "run.yaml", tiny_document(tmp_path, tmp_path))
    status = main(["run", "--config", str(config), "--set", "learners.inner.lr=0"])
    assert status == 2
    assert capsys.readouterr().err == (
        f"offmeta run: invalid config {config} (1 error):\n"
        "  learners.inner.lr: Input should be greater than 0 (got 0)\n"
    )


def test_run_resume_refuses_before_starting_anything_when_there_is_nothing_to_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path / "run.yaml", tiny_document(tmp_path, tmp_path))
    assert main(["run", "--config", str(config), "--resume"]) == 2
    assert capsys.readouterr().err == (
        f"offmeta run: --resume: no unfinished run of 'tiny-robot' with this config under "
        f"{tmp_path / 'runs'}; run without --resume to start a new run, or name a run "
        "directory with --resume RUN_DIR\n"
    )
    assert main(["run", "--config", str(config), "--resume", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"offmeta run: --resume: {tmp_path} is not an offmeta run directory (it has no "
        "run.json); expected a directory under training.checkpoint_dir, e.g. "
        "runs/<flow run id>\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.yaml"]


def _sample_run_args(work: Path, *overrides: str) -> list[str]:
    """``run`` of the shipped point-robot config with every path under ``work`` or absolute."""
    args = ["run", "--config", str(REPO / "flows" / "configs" / "point_robot.yaml")]
    settings = [
        f"data.train={SAMPLES / 'point_robot' / 'train'}",
        f"data.heldout={SAMPLES / 'point_robot' / 'heldout'}",
        f"artifacts.root={work / 'artifacts'}",
        f"training.checkpoint_dir={work / 'runs'}",
        *overrides,
    ]
    return args + [word for setting in settings for word in ("--set", setting)]


@pytest.mark.timeout(300)
def test_run_refuses_a_missing_dataset_before_starting_ray_or_prefect(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing" / "train"
    assert main(["data", "validate", str(missing)]) == 1
    validate_line = capsys.readouterr().err
    assert validate_line == (
        f"offmeta data validate: source '{missing}' does not exist; expected a Parquet file, "
        "a directory or a glob\n"
    )

    done = _offmeta_probe(_sample_run_args(tmp_path, f"data.train={missing}"), cwd=tmp_path)
    assert (done.returncode, done.stdout) == (1, "[]\n")
    assert done.stderr == validate_line.replace("offmeta data validate: ", "offmeta run: ")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(300)
def test_run_refuses_a_heldout_set_of_another_width_before_starting_ray_or_prefect(
    tmp_path: Path,
) -> None:
    heldout = SAMPLES / "sinusoid" / "heldout"
    done = _offmeta_probe(_sample_run_args(tmp_path, f"data.heldout={heldout}"), cwd=tmp_path)
    assert (done.returncode, done.stdout) == (1, "[]\n")
    assert done.stderr == (
        f"offmeta run: held-out dataset {heldout}: obs_shape is [1] but the train dataset "
        f"{SAMPLES / 'point_robot' / 'train'} has [2]; expected held-out tasks of the same task "
        "family (data.heldout must match data.train)\n"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("setting", "refusal"),
    [
        (
            "tasks.support=3000",
            "every one of its 200 tasks has fewer than tasks.support + tasks.query = 3000 + 10 "
            "= 3010 transitions (largest: 100); lower tasks.support or tasks.query",
        ),
        (
            "tasks.meta_batch=1001",
            "its tasks give 1000 samples of tasks.support + tasks.query = 20 transitions per "
            "epoch, fewer than one meta-batch of tasks.meta_batch = 1001 samples; lower "
            "tasks.meta_batch, tasks.support or tasks.query, or add tasks",
        ),
    ],
    ids=["support", "meta_batch"],
)
def test_run_refuses_tasks_the_train_stage_cannot_sample_before_starting_ray_or_prefect(
    tmp_path: Path, setting: str, refusal: str
) -> None:
    done = _offmeta_probe(_sample_run_args(tmp_path, setting), cwd=tmp_path)
    assert (done.returncode, done.stdout) == (1, "[]\n")
    train = SAMPLES / "point_robot" / "train"
    assert done.stderr == f"offmeta run: train dataset {train}: {refusal}\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(120)
def test_serve_refuses_a_cron_schedule_without_a_prefect_server(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API_")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")  # no profile with an API URL
    config = write_config(tmp_path / "run.yaml", tiny_document(tmp_path, tmp_path))
    done = _offmeta_probe(
        ["serve", "--config", str(config), "--cron", "0 3 * * *"], cwd=tmp_path, env=env
    )
    assert done.returncode == 1
    assert done.stderr == (
        "offmeta serve: --cron needs a Prefect server, but PREFECT_API_URL is not set, so "
        "Prefect would start a temporary server that runs no scheduler and the schedule would "
        "never fire; start one (prefect server start) and set PREFECT_API_URL "
        "(e.g. http://127.0.0.1:4200/api)\n"
    )


def _nothing_listening() -> str:
    """A loopback API URL with no server behind it (a port just bound and released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/api"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", ["run", "serve"])
def test_run_and_serve_refuse_a_prefect_api_url_where_nothing_listens(
    tmp_path: Path, command: str
) -> None:
    url = _nothing_listening()
    env = {**os.environ, "PREFECT_API_URL": url}
    args = _sample_run_args(tmp_path)
    args[0] = command
    started = time.monotonic()
    done = _offmeta_probe(args, cwd=tmp_path, env=env)
    assert time.monotonic() - started < 60  # the probe itself waits 3 s at most
    assert (done.returncode, done.stdout) == (1, "[]\n")
    assert done.stderr == (
        f"offmeta {command}: no Prefect server answers at PREFECT_API_URL={url} ({url}/health: "
        "Connection refused); start one there (prefect server start), or unset "
        "PREFECT_API_URL to run on a temporary server\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_serve_refuses_an_invalid_cron(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path / "run.yaml", tiny_document(tmp_path, tmp_path))
    status = main(["serve", "--config", str(config), "--cron", "0 3 * *"])
    assert status == 2
    assert capsys.readouterr().err == (
        "offmeta serve: --cron '0 3 * *' --timezone 'UTC': Invalid cron string: \"0 3 * *\"\n"
    )


@pytest.mark.usefixtures("prefect_harness")
def test_serve_registers_the_cron_deployment_runs_it_and_stops_cleanly(tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL

    from pipeline.artifacts import ArtifactStore

    data = tiny_point_robot(tmp_path / "point_robot")
    document = tiny_document(
        data,
        tmp_path,
        ["artifacts.name=served-robot", "ray.num_cpus=1", "evaluation.rollout_episodes=0"],
    )
    config = write_config(tmp_path / "serve.yaml", document)
    env = {
        **os.environ,
        "PREFECT_API_URL": PREFECT_API_URL.value(),
        "PREFECT_RUNNER_POLL_FREQUENCY": "1",
    }
    offmeta = Path(sys.executable).with_name("offmeta")
    command = [str(offmeta), "serve", "--config", str(config)]
    command += ["--cron", "0 3 * * *", "--name", "nightly"]
    log = tmp_path / "serve.log"
    with open(log, "wb") as output:
        server = subprocess.Popen(command, cwd=REPO, env=env, stdout=output, stderr=output)
    try:
        with get_client(sync_client=True) as client:
            deployment = _wait_for_deployment(client, "meta-train/nightly", server, log)
        assert [s.schedule.cron for s in deployment.schedules] == ["0 3 * * *"]
        assert deployment.parameters["cfg"]["artifacts"]["name"] == "served-robot"

        flow_run = run_deployment(deployment.id, timeout=SERVE_TIMEOUT_S, poll_interval=1)
        assert flow_run.state.is_completed(), log.read_text()[-3000:]
        manifest = ArtifactStore(tmp_path / "artifacts").get("served-robot@latest")
        assert manifest.lineage.flow_run_id == str(flow_run.id)

        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0, log.read_text()[-3000:]
        assert "stopped serving meta-train/nightly" in log.read_text()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=30)


def _wait_for_deployment(
    client: SyncPrefectClient, name: str, server: subprocess.Popen, log: Path
) -> DeploymentResponse:
    from prefect.exceptions import ObjectNotFound

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"offmeta serve exited with {server.returncode}:\n{log.read_text()}")
        try:
            return client.read_deployment_by_name(name)
        except ObjectNotFound:
            time.sleep(0.5)
    pytest.fail(f"deployment {name} was not registered within 90 s:\n{log.read_text()}")
