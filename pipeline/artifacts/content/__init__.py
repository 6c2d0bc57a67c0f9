"""Stored content: parameter encoding, digests, params blobs and content-addressed blobs."""
