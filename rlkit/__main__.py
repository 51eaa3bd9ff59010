"""``python -m rlkit ...`` is the ``rlkit`` command (see :mod:`rlkit.cli`)."""

from rlkit.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
