"""The process around a run: the Ray session and quiet defaults, what reaches the terminal,
the Prefect API it talks to.
"""
