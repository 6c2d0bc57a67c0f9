"""Importers: other tools' recordings into the canonical episode layout, once.

``import_rllib`` reads RLlib's offline recorder output, ``import_minari`` a Minari dataset;
both write sorted, well-sized Parquet files and a ``dataset.json`` that names the importer
and the source's fingerprint, and return an ``ImportSummary``. Neither needs RLlib or Minari
installed.
"""

from pipeline.importers.minari.recording import import_minari
from pipeline.importers.output import ImportSummary
from pipeline.importers.rllib.recording import import_rllib

__all__ = ["ImportSummary", "import_minari", "import_rllib"]
