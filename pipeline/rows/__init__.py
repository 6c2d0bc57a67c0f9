"""The row path: an epoch of row minibatches read from a dataset's files, by windows of files,
with later epochs cached.
"""
