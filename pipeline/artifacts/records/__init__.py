"""The records the store writes and reads: manifests, names, key layout, store roots."""
