"""The ``OFFMETA_VERBOSE`` switch that makes library use quiet or brings Ray's own output back
(what a fresh process prints either way is in ``test_ray_logging_process.py``)."""

from __future__ import annotations

import pytest

from pipeline.reads.ray_logging import VERBOSE_ENV, verbose


def test_the_switch_accepts_1_and_0_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    assert verbose() is False
    monkeypatch.setenv(VERBOSE_ENV, "0")
    assert verbose() is False
    monkeypatch.setenv(VERBOSE_ENV, "1")
    assert verbose() is True
    monkeypatch.setenv(VERBOSE_ENV, "yes")
    with pytest.raises(ValueError) as caught:
        verbose()
    assert str(caught.value) == (
        "OFFMETA_VERBOSE='yes': expected 1 (show Ray's logs and progress) or 0 / unset (quiet)"
    )
