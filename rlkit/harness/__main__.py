"""``python -m rlkit.harness ARGS``: lm-eval's own command line (``lm_eval ARGS``) with the ``rlkit``
model registered first, so ``--model rlkit --model_args model=...,checkpoint=...`` works.

lm-eval 0.4.13 resolves ``--model NAME`` in its own registry only (models listed inside its tree,
no plugin hook; later releases read the ``lm_eval.models`` entry point group, which rlkit's
package metadata declares, so there plain ``lm_eval --model rlkit`` works too).
"""

from __future__ import annotations


def main() -> None:
    import rlkit.harness.model  # noqa: F401 - registers "rlkit" with lm-eval
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
