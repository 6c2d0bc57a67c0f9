"""Files and filesystems: where a dataset's files are, local or ``s3://``, Parquet files read
in order, crash-safe writes and run checkpoints.
"""
