"""Errors raised by the artifact store, one class per way a request can fail."""

from __future__ import annotations


class ArtifactError(Exception):
    """Base class: anything the artifact store refuses or cannot do."""


class ArtifactNameError(ArtifactError, ValueError):
    """A name, alias, file name or reference string that cannot be used."""


class UnsupportedRootError(ArtifactError, ValueError):
    """A store root the store cannot use (an unknown URI scheme, a remote host, a bad bucket)."""


class ArtifactNotFoundError(ArtifactError, LookupError):
    """The requested artifact, version, alias or file does not exist."""


class IntegrityError(ArtifactError):
    """Stored bytes do not match the digest their manifest records.

    ``problems`` holds one line per mismatching or unreadable file, each naming the
    file, where it lives, the expected digest and the digest that was found.
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(self.problems))


class AliasConflictError(ArtifactError):
    """A compare-and-swap on an alias was refused (stale expectation or backwards move)."""


class LockTimeoutError(ArtifactError, TimeoutError):
    """Another process held an artifact's lock for longer than the store waits."""


class StorageError(ArtifactError):
    """The storage behind the store failed a request; the message names the object's URI."""
