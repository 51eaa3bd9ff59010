"""lm-evaluation-harness on rlkit's engines: the field's benchmarks, run the field's way, on any session.

- :mod:`rlkit.harness.model` — ``rlkit``, an lm-eval model backed by a session (``loglikelihood``,
  ``loglikelihood_rolling``, ``generate_until`` on ``compute_logprobs`` / ``sample``, through
  :mod:`rlkit.harness.engine_calls`), any engine, base model, checkpoint or training run
  (:mod:`rlkit.harness.weights`).
- :mod:`rlkit.harness.tasks` — lm-eval's own task configs, with the datasets rlkit ships (GSM8K,
  MBPP) read from the package instead of the hub: same items, order, prompts and scoring;
  :mod:`rlkit.harness.catalog` keeps lm-eval's task names without re-indexing its tree each run;
  :mod:`rlkit.harness.taskdir` writes the same tasks as YAMLs for lm-eval's own command line.
- :mod:`rlkit.harness.code_exec` — code benchmarks (``mbpp``, ``humaneval``) scored in
  :mod:`rlkit.sandbox` instead of HF ``evaluate``'s in-process ``code_eval``.
- :mod:`rlkit.harness.cli` — ``rlkit eval``; ``python -m rlkit.harness`` (:mod:`rlkit.harness.__main__`)
  is lm-eval's own command line with ``--model rlkit`` available (lm-eval 0.4.13 finds no models
  outside its tree) and rlkit's tasks included.
- :mod:`rlkit.harness.during_training` — ``train.eval.harness``: the same evaluation inside a run.

Everything but :mod:`~rlkit.harness.during_training`'s config needs the ``eval`` extra (``pip install
'rlkit[eval]'``) and imports lm-eval only when used; the rest of rlkit reaches this package through
that config and hook (``rlkit.rl``) and ``rlkit eval``'s entry in :data:`rlkit.cli.COMMANDS`.
See docs/evaluation.md.
"""
