"""flows.stages.timings: the ``took ...`` line ``offmeta run`` ends with, and ``read_line``,
which the benches that time runs read it back with."""

from __future__ import annotations

from flows.stages.timings import StageTimes, read_line


def test_read_line_gives_back_the_seconds_of_the_line() -> None:
    line = StageTimes({"validate": 0.1, "train": 360.8, "evaluate": 45.4}).line(44.8, 459.0)
    assert read_line(f"published ...\n{line}\n") == {
        "took": 459.0,
        "before_flow": 44.8,
        "validate": 0.1,
        "train": 360.8,
        "evaluate": 45.4,
        "bookkeeping": 7.9,
    }


def test_the_last_line_counts_and_a_text_without_one_gives_none() -> None:
    first = StageTimes({"train": 1.0}).line(1.0, 3.0)
    last = StageTimes({"train": 2.0}).line(1.0, 4.0)
    assert read_line(f"{first}\n{last}")["train"] == 2.0
    assert read_line("took nothing") is None
