"""Hydra launcher ``hydra/launcher=rlkit_shared``: a sweep's jobs as runs of one local engine in
this process (:mod:`hydra_plugins.rlkit_shared_launcher.rlkit_shared_launcher`)."""
