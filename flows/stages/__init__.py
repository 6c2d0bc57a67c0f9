"""The stages of a meta-training run, each a small typed function: datasets, train, evaluate,
publish.
"""
