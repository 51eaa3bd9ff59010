"""Environments from the field's packages, trained unchanged: adapters onto one text-environment
interface (:mod:`rlkit.tasks.envs.text`) that every rlkit task runs through.

- ``openenv`` (:mod:`~rlkit.tasks.envs.openenv_task`): any OpenEnv ``Environment``, in process or over its server;
- ``textarena`` (:mod:`~rlkit.tasks.envs.textarena_task`): TextArena games, one player or two (self-play
  or a fixed opponent);
- ``verifiers`` (:mod:`~rlkit.tasks.envs.verifiers_task`): a verifiers environment with its rubric.

A fourth is one small file: a :class:`~rlkit.tasks.envs.text.TextEnv` (``reset``/``step`` on text) and a
:class:`~rlkit.tasks.envs.text.TextEnvTask` whose ``make_env`` returns it, registered with
:func:`rlkit.tasks.register_task`. See docs/environments.md.
"""
