"""Writing canonical datasets: well-sized sorted Parquet files, ``offmeta data compact`` and
the external sort behind both.
"""
