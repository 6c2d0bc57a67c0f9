"""Artifact store round trip against plain safetensors, measured in the same run.

Figure: (publish + get + verify + load_params) / (save_file + load_file) for the same
10 MB of parameters, median of several repeats; target <= 2x.

What the store does beyond the baseline: sha256 over the tensors three times (at
publish to name the blob, in verify, and in load_params before handing tensors out:
each is a promise to the caller), fsyncs when durable, and the small JSON files. The
publish-time hash runs on a second thread while safetensors writes the file, and the
read-side hashes use every free core; even so one sha256 pass over 10 MB (~6 ms at
1.8 GB/s, OpenSSL with SHA-NI) costs more than the whole baseline, which writes to the
page cache and maps the file back lazily, so the script prints that pass too.

    .venv/bin/python bench/artifacts.py [--repeats 9] [--megabytes 10]

Each figure is written as a record (``bench/records.py``).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Run as a script, this folder comes first on sys.path and bench/learners.py would shadow the
# `learners` package; the repository root must come first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from safetensors.torch import load_file, save_file

from bench.records import Baseline, write_record
from pipeline.artifacts import ArtifactStore


def make_params(megabytes: float) -> dict[str, dict[str, torch.Tensor]]:
    """Two modules of float32 MLP layers adding up to ``megabytes`` (1 MB = 2**20 bytes)."""
    width = 512
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


def plain_round_trip(flat: dict[str, torch.Tensor], directory: Path) -> float:
    path = directory / "plain.safetensors"
    start = time.perf_counter()
    save_file(flat, str(path))
    loaded = load_file(str(path))
    elapsed = time.perf_counter() - start
    assert loaded.keys() == flat.keys()
    path.unlink()
    return elapsed


def store_round_trip(
    store: ArtifactStore, params: dict[str, dict[str, torch.Tensor]]
) -> dict[str, float]:
    marks = [time.perf_counter()]
    ref = store.publish("bench", params, metrics={"loss": 0.1}, config={"lr": 0.01}, lineage={})
    marks.append(time.perf_counter())
    manifest = store.get("bench", version=ref.version)
    marks.append(time.perf_counter())
    store.verify(ref)
    marks.append(time.perf_counter())
    loaded = store.load_params(ref)
    marks.append(time.perf_counter())
    assert manifest.params_digest == ref.digest and loaded.keys() == params.keys()
    phases = ("publish", "get", "verify", "load")
    timings = {phase: marks[k + 1] - marks[k] for k, phase in enumerate(phases)}
    timings["total"] = marks[-1] - marks[0]
    return timings


def variant(
    params: dict[str, dict[str, torch.Tensor]], i: int
) -> dict[str, dict[str, torch.Tensor]]:
    """``params`` with one element changed, so every publish writes a new params blob."""
    changed = {module: dict(tensors) for module, tensors in params.items()}
    bias = changed["policy"]["layers.0.bias"].clone()
    bias[0] = float(i)
    changed["policy"]["layers.0.bias"] = bias
    return changed


def sha256_pass(flat: dict[str, torch.Tensor]) -> float:
    start = time.perf_counter()
    for key in sorted(flat):
        hashlib.sha256(flat[key].reshape(-1).view(torch.uint8).numpy()).digest()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--megabytes", type=float, default=10.0)
    args = parser.parse_args()
    params = make_params(args.megabytes)
    flat = {f"{m}/{n}": t for m, module in params.items() for n, t in module.items()}
    size = sum(t.numel() * t.element_size() for t in flat.values())
    print(f"parameters: {size / 2**20:.1f} MB in {len(flat)} tensors, {args.repeats} repeats")
    plain: list[float] = []
    hashing: list[float] = []
    runs: dict[str, list[dict[str, float]]] = {"durable": [], "durable=False": []}
    with tempfile.TemporaryDirectory(prefix="offmeta-bench-") as tmp:
        directory = Path(tmp)
        stores = {
            "durable": ArtifactStore(directory / "durable"),
            "durable=False": ArtifactStore(directory / "scratch", durable=False),
        }
        # Interleaved so that machine noise hits baseline and store alike; round 0
        # warms imports, caches and the store's directories and is not counted.
        for i in range(args.repeats + 1):
            plain_time = plain_round_trip(flat, directory)
            hash_time = sha256_pass(flat)
            timings = {
                label: store_round_trip(s, variant(params, i)) for label, s in stores.items()
            }
            if i:
                plain.append(plain_time)
                hashing.append(hash_time)
                for label, timing in timings.items():
                    runs[label].append(timing)
    baseline = statistics.median(plain)
    print(f"baseline save_file + load_file:    {baseline * 1e3:6.1f} ms")
    print(
        f"one sha256 pass over the tensors:  {statistics.median(hashing) * 1e3:6.1f} ms "
        f"({statistics.median(hashing) / baseline:.2f}x baseline; the store needs three)"
    )
    shape = {"megabytes": round(size / 2**20, 1), "tensors": len(flat), "repeats": args.repeats}
    plain_baseline = Baseline("safetensors save_file + load_file, s (median)", baseline)
    for label, timings in runs.items():
        medians = {k: statistics.median(t[k] for t in timings) for k in timings[0]}
        phases = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in medians.items() if k != "total")
        print(
            f"store ({label}): {medians['total'] * 1e3:6.1f} ms ({phases}) "
            f"-> ratio {medians['total'] / baseline:.2f}x (target <= 2x)"
        )
        durable = label == "durable"
        write_record(
            "artifacts",
            "1-round-trip" if durable else "2-round-trip-not-durable",
            f"ArtifactStore({'' if durable else 'durable=False'}) publish + get + verify + "
            "load_params, s (median)",
            medians["total"],
            "s",
            baseline=plain_baseline,
            target="<= 2" if durable else None,
            shape=shape,
            details={f"{phase}_s": seconds for phase, seconds in medians.items()},
        )
    write_record(
        "artifacts",
        "3-sha256-pass",
        "one sha256 pass over the tensors, s (median; the store makes three)",
        statistics.median(hashing),
        "s",
        baseline=plain_baseline,
        shape=shape,
    )


if __name__ == "__main__":
    main()
