"""rlkit's version, in a module of its own: what reports it (the CLI, the ranks' handshake) imports it
without importing the package's ``__init__`` (which connects backends)."""

__version__ = "0.1.0"
