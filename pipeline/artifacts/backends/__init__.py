"""Storage backends of the artifact store: the protocol (``base``), a local directory
(``local``), S3 (``s3``), and ``open_backend`` (``opening``), which picks one for a store root."""
