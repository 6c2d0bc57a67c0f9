"""Per-learner streams: ``split_for_learners`` once, then ``take(num_iters)``; collate and
finalize.
"""
