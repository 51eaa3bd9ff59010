"""lm-evaluation-harness on rlkit's engines: the field's benchmarks, run the field's way, on any session.

- :mod:`rlkit.harness.model` — ``rlkit``, an lm-eval model backed by a session (``loglikelihood``,
  ``loglikelihood_rolling``, ``generate_until`` on ``compute_logprobs`` / ``sample``), any engine,
  base model, LoRA checkpoint or training run (:mod:`rlkit.harness.weights`).
- :mod:`rlkit.harness.tasks` — lm-eval's own task configs, with the datasets rlkit ships (GSM8K,
  MBPP) read from the package instead of the hub: same items, order, prompts and scoring.
- :mod:`rlkit.harness.code_exec` — code benchmarks (``mbpp``, ``humaneval``) scored in
  :mod:`rlkit.sandbox` instead of HF ``evaluate``'s in-process ``code_eval``.
- :mod:`rlkit.harness.cli` — ``rlkit eval``; ``python -m rlkit.harness`` is lm-eval's own command
  line with ``--model rlkit`` available (lm-eval 0.4.13 finds no models outside its tree).

Nothing else in rlkit imports this package (it needs the ``eval`` extra: ``pip install 'rlkit[eval]'``).
"""
