"""Publishing and consuming versions: contents, digests, lineage, files, errors.

Every test that takes ``store`` runs against both backends (a local directory and S3 on a
loopback server)."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pydantic import BaseModel
from safetensors.torch import load_file, save_file

from pipeline.artifacts import (
    ArtifactError,
    ArtifactNotFoundError,
    ArtifactRef,
    ArtifactStore,
    IntegrityError,
    Lineage,
    Manifest,
)
from pipeline.artifacts.content.digest import params_digest, read_params
from tests.helpers.artifact_backends import Storage, blob_key
from tests.helpers.paths import REPO

pytestmark = pytest.mark.timeout(60)


def _params(seed: int = 0) -> dict[str, dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "default_policy": {
            "net.0.weight": torch.randn(8, 3, generator=generator),
            "net.0.bias": torch.randn(8, generator=generator),
        },
        "critic": {"scale": torch.tensor(2.5, dtype=torch.float64)},
    }


def _publish(store: ArtifactStore, name: str = "maml", seed: int = 0, **kwargs) -> ArtifactRef:
    fields = {"metrics": {"loss": 0.5}, "config": {"lr": 0.01}, "lineage": {}} | kwargs
    return store.publish(name, _params(seed), **fields)


@pytest.fixture
def store(storage: Storage) -> ArtifactStore:
    return storage.store()


def test_round_trip_keeps_every_dtype_shape_and_value(store):
    params = {
        "m": {
            "f32": torch.randn(2, 3),
            "f64": torch.randn(4, dtype=torch.float64),
            "f16": torch.randn(3).half(),
            "bf16": torch.randn(5).bfloat16(),
            "i64": torch.arange(6).reshape(2, 3),
            "u8": torch.arange(4, dtype=torch.uint8),
            "flag": torch.tensor([True, False, True]),
            "scalar": torch.tensor(3.0),
            "empty": torch.zeros(0, 4),
            "view": torch.arange(12.0).reshape(3, 4).t(),  # non-contiguous
        },
        "frozen_module_without_params": {},
    }
    ref = store.publish("dtypes", params, metrics={}, config={}, lineage={})
    loaded = store.load_params(ref)
    assert loaded.keys() == params.keys()
    assert loaded["frozen_module_without_params"] == {}
    for name, tensor in params["m"].items():
        got = loaded["m"][name]
        assert got.dtype == tensor.dtype and got.shape == tensor.shape, name
        assert torch.equal(got, tensor), name
    # Loaded tensors are writable and do not alias each other.
    loaded["m"]["f32"].add_(1.0)
    assert torch.equal(loaded["m"]["f64"], params["m"]["f64"])


def test_loaded_params_work_with_functional_call_and_load_state_dict(store):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    params = {"default_policy": {k: v.detach() for k, v in model.named_parameters()}}
    ref = store.publish("policy", params, metrics={}, config={}, lineage={})
    loaded = store.load_params(str(ref), device="cpu")["default_policy"]
    x = torch.randn(5, 3)
    fresh = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    assert torch.equal(torch.func.functional_call(fresh, loaded, (x,)), model(x))
    fresh.load_state_dict(loaded)
    assert torch.equal(fresh(x), model(x))


def test_manifest_records_everything_about_a_version(store, storage, tmp_path):
    parent = _publish(store)
    notes = tmp_path / "notes.md"
    notes.write_text("# evaluation\n")
    ref = store.publish(
        "maml",
        _params(1),
        metrics={"loss": torch.tensor(0.25), "adapted_mse": 0.1, "steps": 500},
        config={"inner_lr": 0.01, "layers": [40, 40]},
        lineage=Lineage(
            dataset_fingerprint="fp-123",
            parent="maml@latest",
            flow_run_id="run-9",
            code_version="0.1.0+abc",
            weights_seq_no=500,
            extras={"restarts": 2},
        ),
        history={"loss": [3.0, 1.0, 0.25], "adapted_mse": [2.0, 0.5, 0.1]},
        files=[notes, ("eval.json", b'{"tasks": 10}')],
        idempotency_key="run-9/publish",
    )
    manifest = store.get("maml")
    assert (ref.name, ref.version, ref.digest) == ("maml", 2, manifest.params_digest)
    assert ref.uri == storage.uri("names/maml/versions/00000002.json")
    assert str(ref) == "maml:2" and manifest.spec == "maml:2"
    assert manifest.schema_version == 1
    assert manifest.created_at.utcoffset() is not None
    assert manifest.idempotency_key == "run-9/publish"
    assert manifest.metrics == {"loss": 0.25, "adapted_mse": 0.1, "steps": 500}
    assert manifest.config == {"inner_lr": 0.01, "layers": [40, 40]}
    assert manifest.lineage == Lineage(
        dataset_fingerprint="fp-123",
        parent=str(parent),
        flow_run_id="run-9",
        code_version="0.1.0+abc",
        weights_seq_no=500,
        extras={"restarts": 2},
    )
    assert manifest.modules == ("critic", "default_policy")
    assert {k: (t.dtype, t.shape) for k, t in manifest.tensors.items()} == {
        "critic/scale": ("F64", ()),
        "default_policy/net.0.bias": ("F32", (8,)),
        "default_policy/net.0.weight": ("F32", (8, 3)),
    }
    assert sorted(manifest.files) == [
        "config.json",
        "eval.json",
        "history.json",
        "learning_curve.json",
        "learning_curve.png",
        "metrics.json",
        "notes.md",
        "params.safetensors",
    ]
    for file_name, entry in manifest.files.items():
        assert len(storage.read(blob_key(entry.digest))) == entry.size, file_name
    assert json.loads(store.read_file(ref, "metrics.json")) == manifest.metrics
    assert json.loads(store.read_file(ref, "config.json")) == manifest.config
    assert json.loads(store.read_file(ref, "history.json"))["loss"] == [3.0, 1.0, 0.25]
    assert store.read_file(ref, "learning_curve.png").startswith(b"\x89PNG\r\n\x1a\n")
    assert manifest.files["learning_curve.png"].media_type == "image/png"
    assert store.read_file(ref, "notes.md") == b"# evaluation\n"
    assert store.read_file(ref, "eval.json") == b'{"tasks": 10}'
    assert store.verify(ref) == manifest


def test_config_may_be_a_pydantic_model(store):
    class Config(BaseModel):
        inner_lr: float = 0.01
        data: Path = Path("data/sinusoid")

    store.publish("maml", _params(), metrics={}, config=Config(), lineage={})
    assert store.get("maml").config == {"inner_lr": 0.01, "data": "data/sinusoid"}


def test_params_digest_follows_the_documented_definition(store):
    ref = _publish(store)
    params = _params()
    tensors = []
    for module in sorted(params):
        for name in sorted(params[module]):
            tensor = params[module][name]
            raw = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            code = {torch.float32: "F32", torch.float64: "F64"}[tensor.dtype]
            tensors.append(
                [
                    f"{module}/{name}",
                    code,
                    list(tensor.shape),
                    "sha256:" + hashlib.sha256(raw).hexdigest(),
                ]
            )
    document = {
        "format": "offmeta.tensors/1",
        "metadata": {"format": "pt", "offmeta.modules": '["critic", "default_policy"]'},
        "tensors": sorted(tensors),
    }
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    assert ref.digest == "sha256:" + hashlib.sha256(canonical).hexdigest()


def test_digest_ignores_insertion_order_but_sees_values_dtypes_and_shapes(store):
    params = _params()
    reordered = {m: dict(reversed(list(p.items()))) for m, p in reversed(list(params.items()))}
    changed_value = _params()
    changed_value["default_policy"]["net.0.bias"][3] += 1e-6
    reshaped = _params()
    reshaped["default_policy"]["net.0.weight"] = reshaped["default_policy"]["net.0.weight"].t()
    reshaped["default_policy"]["net.0.weight"] = reshaped["default_policy"]["net.0.weight"].clone()
    same_bytes_other_dtype = _params()
    weight = same_bytes_other_dtype["default_policy"]["net.0.weight"]
    same_bytes_other_dtype["default_policy"]["net.0.weight"] = weight.view(torch.int32)
    renamed = {"default_policy": params["default_policy"], "critic2": params["critic"]}

    def digest(p):
        return store.publish("d", p, metrics={}, config={}, lineage={}).digest

    base = digest(params)
    assert digest(reordered) == base
    others = [digest(p) for p in (changed_value, reshaped, same_bytes_other_dtype, renamed)]
    assert len({base, *others}) == 5


def test_digest_covers_tensors_not_the_file_layout(tmp_path):
    flat = {"m/a": torch.arange(4.0), "m/b": torch.ones(2, 2, dtype=torch.float64)}
    first, second = tmp_path / "one.safetensors", tmp_path / "two.safetensors"
    save_file(flat, str(first), metadata={"format": "pt"})
    # Same tensors, the header rewritten with other key order and padding.
    data = first.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + length])
    text = json.dumps(dict(reversed(list(header.items()))), indent=1).encode()
    text += b" " * (-len(text) % 8)
    second.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + length :])
    assert second.read_bytes() != first.read_bytes()
    assert load_file(str(second)).keys() == flat.keys()
    assert params_digest(read_params(first))[0] == params_digest(read_params(second))[0]


def test_get_resolve_and_listing(store):
    for seed in range(3):
        _publish(store, seed=seed)
    _publish(store, name="other")
    store.set_alias("maml", "prod", 2, expected=None)
    assert store.list_names() == ["maml", "other"]
    assert store.list_versions("maml") == [1, 2, 3]
    assert store.list_versions("never-published") == []
    assert store.aliases("maml") == {"latest": 3, "prod": 2}
    assert store.get("maml").version == 3
    assert store.get("maml", version=1).version == 1
    assert store.get("maml", alias="prod").version == 2
    assert store.get("maml@prod").version == 2
    assert store.get("maml:1").version == 1
    for spec, version in [("maml", 3), ("maml@latest", 3), ("maml@prod", 2), ("maml:1", 1)]:
        ref = store.resolve(spec)
        assert (ref.name, ref.version) == ("maml", version)
        assert ref.digest == store.get("maml", version=version).params_digest


def test_missing_names_versions_aliases_and_files_say_what_exists(store, storage):
    _publish(store)
    _publish(store, seed=1)
    root = store.root
    cases = [
        (lambda: store.get("nope"), f"no artifact named 'nope' in {root} (artifacts: maml)"),
        (lambda: store.get("maml", version=7), "artifact 'maml' has no version 7 (published: 1-2)"),
        (
            lambda: store.resolve("maml@prod"),
            "artifact 'maml' has no alias 'prod' (aliases: latest)",
        ),
        (
            lambda: store.read_file("maml", "notes.md"),
            "maml:2 has no file 'notes.md' (files: config.json, metrics.json, params.safetensors)",
        ),
        (
            lambda: store.set_alias("maml", "prod", 9, expected=None),
            "artifact 'maml' has no version 9 (published: 1-2)",
        ),
    ]
    for call, message in cases:
        with pytest.raises(ArtifactNotFoundError) as raised:
            call()
        assert str(raised.value) == message
    nothing = storage.sibling("empty")
    empty = nothing.store()
    with pytest.raises(ArtifactNotFoundError, match=r"\(the store has no artifacts yet\)$"):
        empty.get("maml")
    assert empty.list_names() == []
    assert empty.list_versions("maml") == [] and empty.aliases("maml") == {}
    assert nothing.listed() == []
    if nothing.kind == "local":
        assert not Path(nothing.root).exists()


def test_lineage_walks_parents_newest_first(store):
    first = _publish(store)
    second = _publish(store, seed=1, lineage={"parent": first})
    third = _publish(store, name="finetuned", lineage={"parent": "maml@latest"})
    chain = store.lineage(third)
    assert [m.spec for m in chain] == ["finetuned:1", str(second), str(first)]
    assert store.lineage("maml:1")[0].lineage.parent is None
    with pytest.raises(ArtifactError) as raised:
        _publish(store, lineage={"parent": "maml:9"})
    assert str(raised.value) == (
        "lineage parent 'maml:9' not found: artifact 'maml' has no version 9 (published: 1-2)"
    )


def test_invalid_inputs_are_refused_with_what_was_found(store, storage):
    cases = [
        ({"params": [1]}, "params must be a dict {module_id: {param_name: Tensor}}, got list"),
        (
            {"params": {"m": {"w": [1.0]}}},
            "params['m']['w'] must be a torch.Tensor, got list",
        ),
        (
            {"params": {"a/b": {"w": torch.ones(1)}}},
            "params: module id 'a/b' must be a non-empty string without '/'",
        ),
        (
            {"params": {"m": {"w": torch.ones(2, dtype=torch.complex128)}}},
            "params['m']['w'] has dtype torch.complex128, which safetensors cannot store; "
            "supported: BF16, BOOL, C64, F16, F32, F64, F8_E4M3, F8_E5M2, I16, I32, I64, I8, "
            "U16, U32, U64, U8",
        ),
        (
            {"metrics": {"loss": float("nan")}},
            "metrics['loss'] is nan; JSON cannot hold NaN or infinity "
            "(drop it or record it as a string)",
        ),
        (
            {"metrics": {"curve": torch.ones(3)}},
            "metrics['curve'] is a Tensor, which is not JSON data "
            "(call .item() or .tolist() first)",
        ),
        (
            {"config": {"nested": {1: "x"}}},
            "config['nested'] has the key 1; JSON object keys are strings",
        ),
        ({"config": "lr=0.1"}, "config must be a dict, got str"),
        ({"lineage": {"dataset": "x"}}, "lineage is invalid"),
        ({"history": {"loss": [1.0, "x"]}}, "history['loss'][1] is 'x', expected a number"),
        ({"history": {"loss": []}}, "history['loss'] must be a non-empty list of numbers"),
        (
            {"files": ["/does/not/exist.txt"]},
            "files entry '/does/not/exist.txt' is not a readable file",
        ),
        ({"idempotency_key": ""}, "idempotency_key must be a non-empty string, got ''"),
    ]
    for overrides, message in cases:
        fields = {
            "params": _params(),
            "metrics": {},
            "config": {},
            "lineage": {},
        } | overrides
        params = fields.pop("params")
        with pytest.raises(ArtifactError) as raised:
            store.publish("maml", params, **fields)
        assert str(raised.value).startswith(message), str(raised.value)
    assert storage.listed() == []


def test_export_writes_a_standalone_safetensors_file_and_the_manifest(store, tmp_path):
    ref = _publish(store, history={"loss": [1.0, 0.5]})
    written = store.export("maml@latest", tmp_path / "out")
    assert sorted(p.name for p in written) == [
        "config.json",
        "history.json",
        "learning_curve.json",
        "learning_curve.png",
        "manifest.json",
        "metrics.json",
        "params.safetensors",
    ]
    tensors = load_file(str(tmp_path / "out" / "params.safetensors"))
    expected = _params()
    assert sorted(tensors) == sorted(f"{m}/{n}" for m in expected for n in expected[m])
    assert torch.equal(
        tensors["default_policy/net.0.weight"], expected["default_policy"]["net.0.weight"]
    )
    exported = Manifest.model_validate_json((tmp_path / "out" / "manifest.json").read_bytes())
    assert exported == store.get("maml") and exported.params_digest == ref.digest
    with pytest.raises(FileExistsError, match=re.escape("refusing to overwrite config.json")):
        store.export(ref, tmp_path / "out")


def test_identical_content_is_stored_once(store, storage):
    _publish(store)
    _publish(store)
    assert store.list_versions("maml") == [1, 2]
    blobs = storage.listed("blobs/")
    assert len(blobs) == 3  # params, metrics.json, config.json shared by both versions
    if storage.kind == "local":
        modes = {oct(Path(storage.root, blob).stat().st_mode & 0o777) for blob in blobs}
        assert modes == {"0o444"}


def test_importing_the_store_loads_neither_torch_ray_prefect_matplotlib_nor_boto3():
    code = (
        "import sys, pipeline.artifacts, flows.cli.artifacts\n"
        "heavy = ('torch', 'ray', 'prefect', 'matplotlib', 'boto3', 'botocore')\n"
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.strip() == "[]"


def test_a_reference_whose_digest_disagrees_with_the_store_is_refused(store):
    ref = _publish(store)
    stale = ArtifactRef(ref.name, ref.version, "sha256:" + "0" * 64, ref.uri)
    with pytest.raises(IntegrityError) as raised:
        store.load_params(stale)
    assert str(raised.value) == (
        f"maml:1 has params digest {ref.digest} in {store.root}, "
        f"but the reference says sha256:{'0' * 64}"
    )


def test_lineage_parent_may_be_given_as_a_ref(store):
    first = _publish(store)
    _publish(store, seed=1, lineage=Lineage(parent=first, weights_seq_no=3))
    assert store.get("maml").lineage.parent == "maml:1"
