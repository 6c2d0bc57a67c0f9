"""Progress lines of long runs (``flows.stages.progress.TrainingProgress``): iteration,
share done, rates and an ETA, counted from the attempt's own start when resumed."""

from __future__ import annotations

import logging
import re

from flows.stages.progress import TrainingProgress


def test_a_resumed_run_logs_where_it_resumes_and_an_eta_on_every_line(caplog) -> None:
    logger = logging.getLogger("offmeta.test_progress")
    progress = TrainingProgress(total=1000, start=100, rows_per_iteration=250, logger=logger)
    with caplog.at_level(logging.INFO, logger=logger.name):
        progress.begin()
        progress(150, {"query_loss": 0.5, "support_loss_before": 2.0, "support_loss_after": 1.0})
    first, line = (record.getMessage() for record in caplog.records)
    assert first == "resuming at iteration 100/1000 from the last checkpoint"
    pattern = (
        r"iteration 150/1000 \(15%\) \| [\d.]+ it/s \| [\d.]+[kMG]? rows/s \| "
        r"ETA (\d+s|\d+m\d\ds|\d+h\d\dm) \| query_loss 0\.5 \| support_loss 2 -> 1"
    )
    assert re.fullmatch(pattern, line), line
