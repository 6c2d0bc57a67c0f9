"""Around a run: run directories, checkpointed train state, retries, crashed runs, the process."""
