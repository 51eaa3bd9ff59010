"""The one packaging detail pyproject.toml cannot say: the repository's top-level ``configs/`` (the
Hydra config tree, DESIGN §1) ships inside the package as ``rlkit/configs``, in wheels and sdists
alike; an editable install or a source checkout reads it in place (:mod:`rlkit.config_search`).
The Hydra launcher plugin ``hydra_plugins/rlkit_shared_launcher`` ships beside the package."""

from setuptools import find_namespace_packages, setup

setup(
    # hydra_plugins/ is Hydra's plugin namespace (no __init__.py): rlkit's launcher hydra/launcher=rlkit_shared
    packages=find_namespace_packages(include=["rlkit*", "hydra_plugins.rlkit_shared_launcher"]) + ["rlkit.configs"],
    package_dir={"rlkit.configs": "configs"},
)
