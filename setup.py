"""The one packaging detail pyproject.toml cannot say: the repository's top-level ``configs/`` (the
Hydra config tree, DESIGN §1) ships inside the package as ``rlkit/configs``, in wheels and sdists
alike; an editable install or a source checkout reads it in place (:mod:`rlkit.config_search`)."""

from setuptools import find_namespace_packages, setup

setup(
    packages=find_namespace_packages(include=["rlkit*"]) + ["rlkit.configs"],
    package_dir={"rlkit.configs": "configs"},
)
