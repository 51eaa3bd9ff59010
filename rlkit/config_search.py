"""Where ``rlkit train`` finds its configs: the shipped tree, the user's own, and Hydra's search path.

The config tree lives in the repository's top-level ``configs/`` (DESIGN §1) and ships inside the
wheel as ``rlkit/configs`` (``setup.py`` maps it), so both layouts are looked for:
:func:`shipped_config_dir` is ``<package>/configs`` in an installed wheel, ``<checkout>/configs`` in
a source checkout or an editable install.

A user's own configs extend the shipped ones and may replace them (the first match wins)::

    --config-dir/-cd DIR      first (several may be given; the first given wins)
    ./configs                 the working directory's own tree (recipe/, loss/, model/, ... groups)
    the shipped tree          Hydra's "main" config source
    hydra.searchpath=[...]    after the shipped tree, as Hydra places it: adds configs, never replaces

so ``configs/recipe/my_recipe.yaml`` in a project directory runs as ``rlkit train recipe=my_recipe``,
and a project's ``configs/model/tiny.yaml`` replaces the shipped ``model/tiny.yaml`` for that project.
:class:`UserConfigSearchPath` is the Hydra ``SearchPathPlugin`` that puts the first two in front of
the shipped tree (registered by :func:`register_search_path`; it leaves every other Hydra app alone).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

from hydra.core.config_search_path import ConfigSearchPath, SearchPathQuery
from hydra.plugins.search_path_plugin import SearchPathPlugin

from rlkit.errors import RlkitError

USER_DIR = "configs"  # a working directory's own config tree
GROUPS = ("backend", "model", "loss", "logger")  # groups `rlkit --help` lists

#: directories given with --config-dir, in the order given (set by :func:`extra_config_dirs`)
_extra_dirs: List[Path] = []


def shipped_config_dir() -> Path:
    """The config tree rlkit ships: ``rlkit/configs`` when installed from a wheel, the checkout's
    top-level ``configs/`` otherwise."""
    package = Path(__file__).resolve().parent
    for candidate in (package / "configs", package.parent / "configs"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise RlkitError(
        f"rlkit's config tree is missing (no config.yaml in {package / 'configs'} or "
        f"{package.parent / 'configs'}); reinstall rlkit"
    )


def user_config_dirs(cwd: Optional[Path] = None) -> List[Path]:
    """The user's config directories, highest priority first: ``--config-dir`` ones, then
    ``./configs`` (when it exists and is not the shipped tree itself, as in rlkit's own checkout)."""
    shipped = shipped_config_dir()
    out: List[Path] = []
    local = (cwd or Path.cwd()) / USER_DIR
    for d in [*_extra_dirs, local]:
        d = d.resolve()
        if d.is_dir() and d != shipped and d not in out:
            out.append(d)
    return out


@contextlib.contextmanager
def extra_config_dirs(dirs: Sequence[Path]) -> Iterator[None]:
    """``--config-dir`` directories for the duration of one command."""
    global _extra_dirs
    saved = _extra_dirs
    _extra_dirs = [Path(d).expanduser().resolve() for d in dirs]
    try:
        yield
    finally:
        _extra_dirs = saved


class UserConfigSearchPath(SearchPathPlugin):
    """Put the user's config directories in front of rlkit's shipped tree. Only when the search
    path's main source *is* that tree: every other Hydra app in the environment is left alone."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        mains = [e for e in search_path.get_path() if e.provider == "main"]
        if not mains or _as_dir(mains[0].path) != shipped_config_dir():
            return
        for d in user_config_dirs():
            search_path.prepend(
                provider="rlkit user configs", path=f"file://{d}", anchor=SearchPathQuery(provider="main")
            )


def _as_dir(path: Optional[str]) -> Optional[Path]:
    if not path or path.startswith(("pkg://", "structured://")):
        return None
    return Path(path[len("file://") :] if path.startswith("file://") else path).resolve()


def register_search_path() -> None:
    """Register :class:`UserConfigSearchPath` with Hydra, and rlkit's launcher ``hydra/launcher=rlkit_shared``
    (an editable install maps it outside the ``hydra_plugins`` folders Hydra scans) (idempotent)."""
    from hydra.core.plugins import Plugins

    from hydra_plugins.rlkit_shared_launcher.rlkit_shared_launcher import RlkitSharedLauncher

    Plugins.instance().register(UserConfigSearchPath)
    Plugins.instance().register(RlkitSharedLauncher)


# -- listing what is there (for --help) ---------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    name: str
    description: str  # the first comment line of the YAML
    origin: Optional[Path]  # the user directory it comes from; None = shipped
    replaces_shipped: bool = False


def _description(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line.startswith("#") and "@package" not in line:
            return line.lstrip("#").strip()
        if line and not line.startswith("#"):
            break
    return ""


def options(group: str, extra_dirs: Sequence[Path] = ()) -> Dict[str, Option]:
    """Every option of a config group, the user's first (as Hydra will pick them): name -> Option."""
    shipped = shipped_config_dir()
    found: Dict[str, Option] = {}
    shipped_names = {p.stem for p in (shipped / group).glob("*.yaml")}
    for d in [*(Path(x).resolve() for x in extra_dirs), *user_config_dirs()]:
        for path in sorted((d / group).glob("*.yaml")):
            if path.stem not in found:
                found[path.stem] = Option(path.stem, _description(path), d, path.stem in shipped_names)
    for path in sorted((shipped / group).glob("*.yaml")):
        if path.stem not in found:
            found[path.stem] = Option(path.stem, _description(path), None)
    return dict(sorted(found.items(), key=lambda kv: (kv[1].origin is None, kv[0])))


def mark(option: Option, cwd: Optional[Path] = None) -> str:
    """``[./configs]`` or ``[/abs/dir, replaces shipped]`` for a user option; ``""`` if shipped."""
    if option.origin is None:
        return ""
    base = cwd or Path.cwd()
    try:
        where = "./" + str(option.origin.relative_to(base.resolve()))
    except ValueError:
        where = str(option.origin)
    return f"[{where}{', replaces shipped' if option.replaces_shipped else ''}]"
