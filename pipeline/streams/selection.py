"""Which columns and modules a stream delivers, checked against the data before anything
is read: shared by row streams (``pipeline.rows.feed``) and task samples
(``pipeline.tasks.samples``)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from pipeline.contract.schema import DEFAULT_MODULE_ID, REQUIRED_COLUMNS, EpisodeSchema
from pipeline.streams.columns import default_columns


def resolve_columns(schema: EpisodeSchema, columns: Sequence[str] | None) -> tuple[str, ...]:
    """The columns to deliver: the training columns by default, else the ones named."""
    available = list(REQUIRED_COLUMNS)
    available += ["new_obs"] if schema.has_new_obs else []
    available += list(schema.extra_columns)
    if columns is None:
        return default_columns(available)
    if isinstance(columns, str):
        raise TypeError(f"columns must be a sequence of names, got the string {columns!r}")
    ids = [name for name in columns if name in ("module_id", "task_id")]
    if ids:
        raise ValueError(
            f"columns {ids} group the rows (batches are keyed by module, meta-batches by "
            "task); leave them out of columns="
        )
    missing = [name for name in columns if name not in available]
    if missing:
        raise ValueError(f"columns {missing} are not in the data; available: {available}")
    if schema.eps_id_type == "string" and "eps_id" in columns:
        raise ValueError(
            "column 'eps_id' holds strings, which cannot become a tensor; leave it out of "
            "columns= (or store integer episode ids)"
        )
    return tuple(dict.fromkeys(columns))


def check_modules(
    modules_to_update: Collection[str] | None, module_ids: tuple[str, ...] | None
) -> frozenset[str] | None:
    """``modules_to_update`` as a set, refusing ids the data does not have."""
    if modules_to_update is None:
        return None
    if isinstance(modules_to_update, str):
        raise TypeError(
            f"modules_to_update must be a collection of module ids, got the string "
            f"{modules_to_update!r} (write [{modules_to_update!r}])"
        )
    modules = frozenset(modules_to_update)
    if not modules:
        raise ValueError("modules_to_update is empty: no row would ever be delivered")
    unknown = sorted(modules - set(module_ids)) if module_ids is not None else []
    if unknown:
        default = (
            f" (rows without a module_id column belong to {DEFAULT_MODULE_ID!r})"
            if module_ids == (DEFAULT_MODULE_ID,)
            else ""
        )
        raise ValueError(
            f"modules_to_update names {unknown}, which the data does not have; its modules "
            f"are {list(module_ids or ())}{default}"
        )
    return modules
