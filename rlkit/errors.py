"""rlkit's exceptions.

Every error a user can cause (a bad argument, a malformed datum, a wrong config key) is an
:class:`RlkitError` whose message is one line naming *what* is wrong and *where*. The CLI turns
these into one line on stderr and exit code 2, without a traceback.
"""

from __future__ import annotations


class RlkitError(Exception):
    """Base class of every error rlkit raises on purpose."""


class InvalidInputError(RlkitError, ValueError):
    """An argument, datum or parameter value was refused before any state changed."""


class ConfigError(RlkitError, ValueError):
    """A configuration key, value or composition is invalid."""


class DataError(RlkitError, ValueError):
    """A dataset file or row is missing or malformed."""


class CheckpointNotFoundError(RlkitError, KeyError):
    """A checkpoint id does not name a saved checkpoint."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class CheckpointCorruptError(RlkitError, ValueError):
    """A checkpoint's files do not match what was recorded when it was written (a file truncated,
    missing, overwritten, or not parseable); ``file`` names the file, ``checkpoint`` the id."""

    def __init__(self, message: str, *, checkpoint: str = "", file: str = ""):
        super().__init__(message)
        self.checkpoint = checkpoint
        self.file = file


class ClientStoppedError(RlkitError, RuntimeError):
    """A client was used after ``stop()``."""


class OperationError(RlkitError, RuntimeError):
    """An operation was accepted but failed while it executed."""


class BackendUnavailableError(RlkitError, RuntimeError):
    """A backend cannot be used here (missing optional dependency, no credentials, ...)."""


def listen_error(host: str, port: int, exc: OSError) -> ConfigError:
    """One line for a server that cannot take ``host:port`` (a port in use, an address that is not
    this machine's, a port it may not take): every rlkit server reports it the same way, exit 2."""
    import errno

    if exc.errno == errno.EADDRINUSE:
        why = "the address is already in use (another server?); choose another --port, or --port 0 for a free one"
    else:
        why = exc.strerror or str(exc)
    return ConfigError(f"cannot listen on {host}:{port}: {why}")


class RlkitWarning(UserWarning):
    """A setting an engine accepts but cannot honour exactly, said where a plain script sees it
    (the ``warnings`` module, not a logger): e.g. a LoRA seed SageMaker does not take."""
