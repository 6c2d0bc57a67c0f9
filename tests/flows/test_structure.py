"""The flow chooses where to train: neither training stage imports the other's caller.

(That no module of the project imports in a circle is ``tests/test_import_graph.py``.)
"""

from __future__ import annotations

from tests.helpers.paths import REPO
from tests.test_import_graph import import_graph


def test_the_flow_chooses_where_to_train():
    graph = import_graph(REPO, ("flows",))
    assert "flows.scale_out.driver" in graph["flows.scale_out"]
    assert "flows.scale_out" not in graph["flows.stages.train"]
    assert {"flows.stages.train", "flows.scale_out"} <= graph["flows.meta_train"]
