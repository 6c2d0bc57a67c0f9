"""Eight ``offmeta run``s started together against one Prefect server, one S3 store (moto)
and one Ray all complete: the name's versions are 1-8 without a gap, each version's lineage
names its own flow run and run directory, and each version holds what its own run trained and
nothing of another's.

The runs share one single-node Ray (``ray start --head``), as docs/runs.md says to run many at
once on one machine: eight local Rays started together on two cores do not all start (Ray
gives a raylet 30 s to register; here half of them missed it, even started one at a time)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import torch
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType

from flows.runs.run_dirs import read_run
from pipeline.artifacts import ArtifactStore
from pipeline.io.checkpoints import read_shard
from tests.helpers.concurrent_runs import run_together, seeded_configs
from tests.helpers.flow_runs import tiny_point_robot
from tests.helpers.ray_cluster import ray_cluster

RUNS = 8
DEADLINE_S = 1500
"""For all eight to end: each run alone takes about 30 s on two idle cores."""

pytestmark = [
    pytest.mark.system,
    pytest.mark.usefixtures("prefect_harness"),
    pytest.mark.timeout(DEADLINE_S + 300),
]
_PUBLISHED = re.compile(r"^published (tiny-robot:\d+): ", re.MULTILINE)


def test_eight_runs_started_together_publish_eight_versions_each_its_own(
    s3_root: str, tmp_path: Path
) -> None:
    data = tiny_point_robot(tmp_path / "point_robot")
    # Logical CPUs for one read job per run: eight runs queue for the two cores, not for Ray.
    with ray_cluster(tmp_path / "unused", worker_nodes=0, head_cpus=RUNS) as cluster:
        configs = seeded_configs(data, tmp_path, s3_root, RUNS, cluster.address, "tiny-robot")
        together = run_together(tmp_path, configs, cluster.environment, deadline_s=DEADLINE_S)
    for config, ended in zip(configs, together.ended, strict=True):
        assert ended.returncode == 0, f"{config}:\n{ended.output[-4000:]}"
    print(
        f"{RUNS} runs together: wall {together.wall_s:.0f} s, peak resident sets "
        f"{together.peak_rss_mb:.0f} MB together, {together.peak_process_rss_mb:.0f} MB in one "
        "process"
    )

    store = ArtifactStore(s3_root)
    assert store.list_versions("tiny-robot") == list(range(1, RUNS + 1))
    published = {
        _PUBLISHED.search(ended.output)[1]: seed for seed, ended in enumerate(together.ended)
    }
    assert sorted(published) == sorted(f"tiny-robot:{v}" for v in range(1, RUNS + 1))
    flow_runs = set()
    for spec, seed in published.items():
        manifest = store.verify(spec)
        flow_run = manifest.lineage.flow_run_id
        run_dir = tmp_path / "runs" / flow_run
        checkpoint = Path(urlsplit(manifest.lineage.extras["checkpoint"]).path)
        assert checkpoint.parent.parent == run_dir, spec
        record = read_run(run_dir)
        assert [start["flow_run_id"] for start in record.starts] == [flow_run], spec
        assert record.finished["artifact"] == spec
        assert record.config == manifest.config
        assert manifest.config["learners"]["seed"] == seed, spec
        trained = read_shard(checkpoint, 0)["learner"]["params"]
        loaded = store.load_params(spec)
        assert loaded.keys() == trained.keys()
        for module, params in loaded.items():
            for name, tensor in params.items():
                assert torch.equal(tensor, trained[module][name]), (spec, module, name)
        flow_runs.add(flow_run)
    assert len(flow_runs) == RUNS
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == sorted(flow_runs)
    assert asyncio.run(_states(flow_runs)) == {
        flow_run: StateType.COMPLETED for flow_run in flow_runs
    }
    # Eight seeds, eight sets of parameters: no version holds another's.
    assert len({store.verify(spec).params_digest for spec in published}) == RUNS


async def _states(flow_runs: set[str]) -> dict[str, StateType]:
    async with get_client() as client:
        return {
            flow_run: (await client.read_flow_run(flow_run)).state.type for flow_run in flow_runs
        }
