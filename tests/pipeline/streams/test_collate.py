"""collate / collate_minibatches / finalize on in-memory Arrow tables (no Ray)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from pipeline.contract.schema import DEFAULT_MODULE_ID
from pipeline.streams.collate import collate, collate_minibatches, finalize


def _table(modules: list[str] | None, *, dictionary: bool = True, **columns) -> pa.Table:
    """Rows whose ``rewards`` and ``obs[:, 0]`` are the row index, so rows can be traced."""
    rows = len(modules) if modules is not None else 6
    ids = np.arange(rows)
    obs = np.stack([ids, ids * 10, ids * 100], axis=1).astype(np.float32)
    data = {
        "obs": pa.FixedShapeTensorArray.from_numpy_ndarray(obs),
        "actions": pa.array(ids % 3, pa.int64()),
        "rewards": pa.array(ids.astype(np.float32)),
        "terminateds": pa.array(ids % 2 == 1),
        "truncateds": pa.array(np.zeros(rows, bool)),
    }
    if modules is not None:
        column = pa.array(modules)
        data["module_id"] = column.dictionary_encode() if dictionary else column
    data.update(columns)
    return pa.table(data)


def _rows(batch, module: str) -> list[int]:
    return batch[module]["rewards"].int().tolist()


def test_collate_groups_rows_per_module_in_row_order():
    table = _table(["b", "a", "b", "c", "a", "b"])

    batch = collate(table)

    assert list(batch) == ["a", "b", "c"]
    assert _rows(batch, "a") == [1, 4]
    assert _rows(batch, "b") == [0, 2, 5]
    assert _rows(batch, "c") == [3]
    b = batch["b"]
    assert set(b) == {"obs", "actions", "rewards", "terminateds", "truncateds"}
    assert b["obs"].dtype == torch.float32 and b["obs"].shape == (3, 3)
    assert b["obs"][:, 1].tolist() == [0.0, 20.0, 50.0]
    assert b["actions"].dtype == torch.int64 and b["actions"].tolist() == [0, 2, 2]
    assert b["terminateds"].dtype == torch.bool and b["terminateds"].tolist() == [0, 0, 1]


def test_collate_drops_modules_not_updated_and_selects_columns():
    table = _table(["b", "a", "b", "c", "a", "b"])

    batch = collate(table, columns=["obs", "rewards"], modules_to_update={"a", "c"})

    assert list(batch) == ["a", "c"]
    assert set(batch["a"]) == {"obs", "rewards"}
    assert _rows(batch, "a") == [1, 4]


def test_rows_without_module_column_belong_to_default_module():
    batch = collate(_table(None))

    assert list(batch) == [DEFAULT_MODULE_ID]
    assert _rows(batch, DEFAULT_MODULE_ID) == [0, 1, 2, 3, 4, 5]


def test_plain_string_and_differently_encoded_chunks_give_the_same_codes():
    first = _table(["x", "y", "x"], dictionary=False)
    assert _rows(collate(first), "x") == [0, 2]
    second = _table(["y", "z", "y"])
    second = second.set_column(
        second.schema.get_field_index("module_id"),
        "module_id",
        pa.array(["y", "z", "y"]).dictionary_encode().cast(pa.dictionary(pa.int32(), pa.string())),
    )
    table = pa.concat_tables([first.cast(second.schema), second])

    batch = collate(table)

    assert list(batch) == ["x", "y", "z"]
    assert _rows(batch, "x") == [0, 2]
    assert _rows(batch, "y") == [1, 0, 2]
    assert _rows(batch, "z") == [1]


def test_collate_minibatches_follow_the_order_and_share_one_buffer():
    table = _table(["a", "b"] * 6)
    order = np.array([11, 3, 4, 0, 7, 8, 1, 2, 10, 9, 6, 5])

    batches = collate_minibatches(table, order, 4)

    assert len(batches) == 3
    for index, batch in enumerate(batches):
        expected = order[index * 4 : (index + 1) * 4]
        got = sorted(_rows(batch, "a") + _rows(batch, "b"))
        assert got == sorted(expected.tolist())
        assert all(row % 2 == 0 for row in _rows(batch, "a"))
        assert _rows(batch, "a") == [r for r in expected.tolist() if r % 2 == 0]
    # Every minibatch tensor is a view into one gathered buffer per column: no copies.
    storages = {b[m]["obs"].untyped_storage().data_ptr() for b in batches for m in b}
    assert len(storages) == 1


def test_collate_minibatches_refuses_a_partial_minibatch():
    with pytest.raises(ValueError, match=r"5 rows do not divide into minibatches of 4"):
        collate_minibatches(_table(["a"] * 6), np.arange(5), 4)


def test_fixed_size_list_columns_become_tensors():
    values = np.arange(12, dtype=np.float32).reshape(6, 2)
    listed = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), 2)
    table = _table(None, new_obs=listed).slice(1, 4)

    batch = collate(table, columns=["new_obs"])

    assert batch[DEFAULT_MODULE_ID]["new_obs"].tolist() == values[1:5].tolist()


def test_collate_errors_name_the_column_and_what_was_expected():
    table = _table(["a", "b", "a", "b", "a", "b"], note=pa.array(list("abcdef")))
    with pytest.raises(TypeError, match=r"column 'note' has Arrow type string; only numeric"):
        collate(table, columns=["note"])
    with pytest.raises(ValueError, match=r"columns \['missing'\] are not in the data"):
        collate(table, columns=["missing"])
    nulls = _table(None, rewards=pa.array([1.0, None, 3.0, 4.0, 5.0, 6.0], pa.float32()))
    with pytest.raises(ValueError, match=r"column 'rewards' has 1 null values"):
        collate(nulls)
    no_module = _table(None, module_id=pa.array(["a", None, "a", "a", "a", "a"]))
    with pytest.raises(ValueError, match=r"column 'module_id' has 1 null values"):
        collate(no_module)


def test_finalize_on_cpu_returns_the_same_tensors_without_pinning():
    batch = collate(_table(["a", "b", "a", "b", "a", "b"]))
    meta = {"support": batch, "query": batch}

    moved = finalize(meta, "cpu")

    for part in ("support", "query"):
        for module, columns in batch.items():
            for name, tensor in columns.items():
                assert moved[part][module][name] is tensor
                assert not moved[part][module][name].is_pinned()


def test_finalize_refuses_what_is_not_a_tensor():
    with pytest.raises(TypeError, match=r"expected nested dicts of tensors, found list"):
        finalize({"a": {"obs": [1, 2]}}, "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_finalize_on_cuda_copies_pinned_tensors_on_a_side_stream():
    table = _table(["a", "b"] * 32)
    [batch] = collate_minibatches(table, np.arange(64), 64, pin_memory=True)
    assert batch["a"]["obs"].is_pinned()
    unpinned = collate(table)

    compute = torch.cuda.Stream()
    with torch.cuda.stream(compute):
        moved = finalize(batch, "cuda")
        moved_unpinned = finalize(unpinned, "cuda")
        total = moved["a"]["obs"].sum() + moved_unpinned["b"]["rewards"].sum()
    compute.synchronize()

    assert moved["a"]["obs"].device.type == "cuda"
    assert torch.equal(moved["a"]["obs"].cpu(), batch["a"]["obs"])
    assert torch.equal(moved_unpinned["b"]["rewards"].cpu(), unpinned["b"]["rewards"])
    terms = [batch["a"]["obs"], unpinned["b"]["rewards"]]
    # Whole numbers whose sums stay below 2 / eps (2^24 in float32) are exact, so the device
    # and the CPU agree exactly in whatever order they add them.
    assert sum(float(t.abs().sum()) for t in terms) < 2 / torch.finfo(terms[0].dtype).eps
    assert total.item() == (terms[0].sum() + terms[1].sum()).item()
