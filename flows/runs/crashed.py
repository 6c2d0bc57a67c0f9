"""Flow runs whose process died mid-run are marked CRASHED, so Prefect stops showing them
RUNNING.

A process killed by SIGKILL (the OOM killer, a lost node) cannot report its own end. Its run
directory tells the next ``offmeta run`` on the same runs root: unfinished, and its lock free
(``flows.runs.run_dirs.abandoned_flow_runs``). The flow runs recorded there that Prefect still holds
in a non-final state are set to CRASHED, with a message naming the run directory.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from uuid import UUID


def mark_crashed(
    flow_runs: Iterable[tuple[str, Path | str]],
    *,
    logger: logging.Logger | logging.LoggerAdapter,
) -> list[str]:
    """Set each ``(flow run id, run directory or its s3:// URI)``'s flow run CRASHED unless
    its state is final already; returns the ids it marked. Flow runs this Prefect API does not
    know (recorded on another server) are left alone."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound
    from prefect.states import Crashed

    marked = []
    with get_client(sync_client=True) as client:
        for flow_run_id, run_dir in flow_runs:
            try:
                found = client.read_flow_run(UUID(flow_run_id))
            except (ObjectNotFound, ValueError):
                continue
            if found.state is not None and found.state.is_final():
                continue
            state = found.state.type.value if found.state is not None else "no state"
            client.set_flow_run_state(
                found.id,
                Crashed(
                    message=f"its process ended without finishing the run (killed?): the run "
                    f"directory {run_dir} is unfinished and no process holds it; continue it "
                    "with offmeta run --resume"
                ),
                force=True,
            )
            logger.warning(
                "flow run %s (%s) was still %s although its process is gone; marked it CRASHED",
                found.name,
                flow_run_id,
                state,
            )
            marked.append(flow_run_id)
    return marked
