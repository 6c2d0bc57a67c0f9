"""`learners` keeps its boundary: importing it loads nothing from Ray, Prefect or `pipeline`."""

from __future__ import annotations

import subprocess
import sys


def test_learners_import_nothing_from_ray_prefect_or_pipeline():
    probe = (
        "import sys, learners; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'ray', 'prefect', 'pipeline'}))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
