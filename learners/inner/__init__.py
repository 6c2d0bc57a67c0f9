"""The inner (differentiable) learner: functional updates of parameter dicts on a task's
support set.
"""
