"""The S3 commands of docs/artifacts.md run as written against the loopback server (docs that run):
the CLI lines and the consumer one-liner of the bash block that uses s3://models/offmeta."""

from __future__ import annotations

import re
import shlex
import sys

import boto3
import pytest
import torch

from pipeline.artifacts import ArtifactStore
from tests.helpers.paths import REPO
from tests.helpers.s3_server import OFFMETA, run_in_repo

pytestmark = pytest.mark.timeout(180)
REPO = REPO


def _s3_block() -> list[str]:
    page = (REPO / "docs" / "artifacts.md").read_text()
    section = page.split("## On S3 {#on-s3}\n", 1)[1].split("\n## ", 1)[0]
    (block,) = [b for b in re.findall(r"```bash\n(.*?)```", section, re.DOTALL) if "s3://" in b]
    return [line for line in block.splitlines() if line.strip()]


def test_the_readme_s3_commands_run_as_written(s3_endpoint):
    lines = _s3_block()
    assert lines[0].startswith("pip install offmeta ")
    assert lines[1].startswith("export AWS_ENDPOINT_URL=")  # the fixture sets it to the server
    client = boto3.session.Session().client("s3")
    if "models" not in {bucket["Name"] for bucket in client.list_buckets()["Buckets"]}:
        client.create_bucket(Bucket="models")
    params = {"default_policy": {"w": torch.ones(2, 2)}}
    store = ArtifactStore("s3://models/offmeta")
    ref = store.publish("sinusoid-maml", params, metrics={}, config={}, lineage={})
    outputs = []
    for line in lines[2:]:
        words = shlex.split(line, comments=True)
        program = {"offmeta": OFFMETA, "python": [sys.executable]}
        result = run_in_repo(program[words[0]] + words[1:])
        assert result.returncode == 0, (line, result.stderr)
        outputs.append(result.stdout)
    assert "sinusoid-maml" in outputs[0]
    assert outputs[1] == f"OK      {ref}  (3 files verified)\n"
    assert outputs[2] == "['default_policy']\n"
