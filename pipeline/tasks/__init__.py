"""The task path: per-task support/query samples for meta-learning, in memory or read in
windows of whole tasks.
"""
