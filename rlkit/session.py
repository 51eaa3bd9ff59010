"""The training-session contract, kept importable here for older code: its home is
:mod:`rlkit.engine` (protocols, capabilities, checks, the client bases, loss routing, the registry)."""

from rlkit.engine import *  # noqa: F401,F403 - re-exported: the contract's names
from rlkit.engine import __all__  # noqa: F401
