"""The meta-training loop, meta-batches read ahead of it, and data-parallel learners kept in
step.
"""
