"""``python -m rlkit.harness ARGS``: lm-eval's own command line (``lm_eval ARGS``) with the ``rlkit``
model registered and rlkit's task directory included, so that

    python -m rlkit.harness --model rlkit --model_args model=smollm2-135m-instruct,precision=fp32 --tasks gsm8k
    python -m rlkit.harness --model hf --model_args pretrained=DIR,dtype=float32 --tasks gsm8k     (same items)

run lm-eval's own evaluation, offline for the data rlkit ships, with code tasks in rlkit's sandbox
(:mod:`rlkit.harness.taskdir`; not added when you pass your own ``--include_path``).
``python -m rlkit.harness tasks-dir`` prints that directory, for plain ``lm_eval --include_path``.

lm-eval 0.4.13 resolves ``--model NAME`` in its own registry only (models listed inside its tree,
no plugin hook); later releases read the ``lm_eval.models`` entry-point group, which rlkit's package
metadata declares, so there plain ``lm_eval --model rlkit`` works too.
"""

from __future__ import annotations

import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    from rlkit.harness.taskdir import task_dir

    if args[:1] == ["tasks-dir"]:
        print(task_dir())
        return
    import rlkit.harness.model  # noqa: F401 - registers "rlkit" with lm-eval
    from lm_eval.__main__ import cli_evaluate

    running = bool(args) and (args[0] == "run" or args[0].startswith("--"))
    if running and not any(a == "--include_path" or a.startswith("--include_path=") for a in args):
        args += ["--include_path", str(task_dir())]
    sys.argv = ["lm-eval", *args]
    cli_evaluate()


if __name__ == "__main__":
    main()
