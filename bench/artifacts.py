"""The artifact store against the plain operations it is built on, measured in the same run.

Three figures, each the median over rounds of the store's time / the baseline's time, the
two interleaved round by round so that machine noise hits both:

1. ``s3-publish-load``: ``ArtifactStore("s3://...")`` publish + ``load_params`` of a
   100 MB model vs boto3 ``put_object`` + ``get_object`` of the same safetensors bytes, on
   moto's S3 server over loopback (target <= 1.5x). On top of the transfer the store hashes
   the tensors twice (to name the blob, and to verify what it loads), writes the small JSON
   files and the manifest, and claims the version.
2. ``local-publish``: publish into a local directory (durable) vs safetensors
   ``save_file`` + fsync of the same tensors (target <= 1.5x).
3. ``local-load``: verified ``load_params`` vs safetensors ``load_file`` plus one sha256
   pass over the loaded tensors (target <= 1.5x).

Every round publishes a new version (one element changed) so that every publish writes a
new params blob. Each figure is written as a record (``bench/records.py``).

    .venv/bin/python bench/artifacts.py [--megabytes 100] [--rounds 5] [--no-s3]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

# Run as a script, this folder comes first on sys.path and bench/learners.py would shadow the
# `learners` package; the repository root must come first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from safetensors.torch import load_file, save, save_file

from bench.records import Baseline, write_record
from pipeline.artifacts import ArtifactRef, ArtifactStore
from pipeline.io.fsio import fsync_file

Params = dict[str, dict[str, torch.Tensor]]
T = TypeVar("T")
TARGET = "<= 1.5"


def make_params(megabytes: float) -> Params:
    """Two modules of float32 1024-wide layers adding up to ``megabytes`` (2**20 bytes)."""
    width = 1024
    layers = max(1, round(megabytes * 2**20 / 4 / (width * width + width) / 2))
    generator = torch.Generator().manual_seed(0)
    return {
        module: {
            name: torch.randn(shape, generator=generator)
            for i in range(layers)
            for name, shape in (
                (f"layers.{i}.weight", (width, width)),
                (f"layers.{i}.bias", (width,)),
            )
        }
        for module in ("policy", "value")
    }


def variant(params: Params, i: int) -> Params:
    """``params`` with one element changed, so every publish writes a new params blob."""
    changed = {module: dict(tensors) for module, tensors in params.items()}
    bias = changed["policy"]["layers.0.bias"].clone()
    bias[0] = float(i)
    changed["policy"]["layers.0.bias"] = bias
    return changed


def flat(params: Params) -> dict[str, torch.Tensor]:
    return {f"{module}/{name}": t for module, named in params.items() for name, t in named.items()}


def timed(work: Callable[..., T], *args: Any) -> tuple[float, T]:
    start = time.perf_counter()
    result = work(*args)
    return time.perf_counter() - start, result


def publish(store: ArtifactStore, params: Params) -> ArtifactRef:
    return store.publish("bench", params, metrics={"loss": 0.1}, config={"lr": 0.01}, lineage={})


def publish_and_load(store: ArtifactStore, params: Params) -> None:
    loaded = store.load_params(publish(store, params))
    assert loaded.keys() == params.keys()


def put_and_get(client: Any, key: str, data: bytes) -> None:
    client.put_object(Bucket="bench", Key=key, Body=data)
    body = client.get_object(Bucket="bench", Key=key)["Body"].read()
    assert len(body) == len(data)


def save_and_sync(tensors: dict[str, torch.Tensor], path: Path) -> None:
    save_file(tensors, str(path))
    fsync_file(path)


def load_and_hash(path: Path) -> None:
    digest = hashlib.sha256()
    for tensor in load_file(str(path)).values():
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())


def s3_rounds(params: Params, rounds: int) -> tuple[list[float], list[float]]:
    """Per round: store publish + load_params, and plain put_object + get_object, seconds."""
    import boto3

    from tests.helpers.s3_server import client_environment, moto_server

    store_times, plain_times = [], []
    with moto_server("threaded") as endpoint:
        os.environ.update(client_environment(endpoint))
        client = boto3.session.Session().client("s3")
        client.create_bucket(Bucket="bench")
        store = ArtifactStore("s3://bench/store")
        for i in range(rounds + 1):  # round 0 warms connections and imports, not counted
            changed = variant(params, i)
            plain_time, _ = timed(put_and_get, client, f"plain/{i}", save(flat(changed)))
            store_time, _ = timed(publish_and_load, store, changed)
            client.delete_object(Bucket="bench", Key=f"plain/{i}")
            store.gc(older_than=0)  # keeps the server's memory flat across rounds
            if i:
                plain_times.append(plain_time)
                store_times.append(store_time)
    return store_times, plain_times


def local_rounds(params: Params, rounds: int, directory: Path) -> dict[str, list[float]]:
    """Per round: publish, save_file + fsync, load_params, load_file + one sha256 pass."""
    store = ArtifactStore(directory / "store")
    times: dict[str, list[float]] = {"publish": [], "save": [], "load": [], "plain_load": []}
    for i in range(rounds + 1):  # round 0 warms caches and the store's folders, not counted
        changed = variant(params, i)
        path = directory / f"plain-{i}.safetensors"
        round_times = {"save": timed(save_and_sync, flat(changed), path)[0]}
        round_times["publish"], ref = timed(publish, store, changed)
        round_times["plain_load"] = timed(load_and_hash, path)[0]
        round_times["load"] = timed(store.load_params, ref)[0]
        path.unlink()
        if i:
            for name, seconds in round_times.items():
                times[name].append(seconds)
    return times


def report(
    figure: str,
    what: str,
    store_times: list[float],
    base: str,
    base_times: list[float],
    shape: dict[str, object],
) -> None:
    ratios = [s / b for s, b in zip(store_times, base_times, strict=True)]
    ratio = statistics.median(ratios)
    print(
        f"{figure}: {what} {statistics.median(store_times):.3f} s vs {base} "
        f"{statistics.median(base_times):.3f} s -> {ratio:.2f}x (target {TARGET}x; "
        f"rounds {min(ratios):.2f}-{max(ratios):.2f})"
    )
    write_record(
        "artifacts",
        figure,
        f"{what}, s (median of rounds)",
        statistics.median(store_times),
        "s",
        baseline=Baseline(f"{base}, s (median of rounds)", statistics.median(base_times)),
        ratio=ratio,
        target=TARGET,
        shape=shape,
        details={
            "ratio_is": "median of per-round ratios",
            "store_s": store_times,
            "baseline_s": base_times,
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=float, default=100.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-s3", action="store_true", help="only the local figures")
    args = parser.parse_args()
    params = make_params(args.megabytes)
    tensors = flat(params)
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    print(f"parameters: {size / 2**20:.1f} MB in {len(tensors)} tensors, {args.rounds} rounds")
    shape = {"megabytes": round(size / 2**20, 1), "tensors": len(tensors), "rounds": args.rounds}
    if not args.no_s3:
        store_times, plain_times = s3_rounds(params, args.rounds)
        report(
            "4-s3-publish-load",
            "S3 (moto over loopback) ArtifactStore publish + load_params",
            store_times,
            "boto3 put_object + get_object of the same safetensors bytes",
            plain_times,
            shape,
        )
    with tempfile.TemporaryDirectory(prefix="offmeta-bench-", dir=".") as tmp:
        times = local_rounds(params, args.rounds, Path(tmp))
    report(
        "5-local-publish",
        "local ArtifactStore publish (durable)",
        times["publish"],
        "safetensors save_file + fsync",
        times["save"],
        shape,
    )
    report(
        "6-local-load",
        "local ArtifactStore load_params (verified)",
        times["load"],
        "safetensors load_file + one sha256 pass",
        times["plain_load"],
        shape,
    )


if __name__ == "__main__":
    main()
