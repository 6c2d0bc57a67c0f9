"""The episode data contract: canonical columns, ``dataset.json``, and the checks that refuse a
dataset before training.
"""
