"""What every backend's clients check and coerce, kept importable here for older code: its home is
:mod:`rlkit.engine` (:mod:`~rlkit.engine.capabilities`, :mod:`~rlkit.engine.checks`,
:mod:`~rlkit.engine.clients`)."""

from rlkit.engine import *  # noqa: F401,F403 - re-exported: the contract's names
from rlkit.engine import __all__  # noqa: F401
