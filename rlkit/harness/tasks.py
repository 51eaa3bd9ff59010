"""lm-eval's tasks as ``rlkit eval`` runs them: its own configs, rlkit's copies of the data, code in the sandbox.

**Data rlkit ships** (``rlkit/assets/data``, byte-identical to the hub's files, see its README and
``SHA256SUMS``) is always read from the package, never the hub: any lm-eval task over
``openai/gsm8k`` ``main`` (``gsm8k``, ``gsm8k_cot``, ``gsm8k_cot_zeroshot``, ...) or
``google-research-datasets/mbpp`` ``full`` (``mbpp``, ``mbpp_instruct``) gets ``dataset_path: json``
and ``dataset_kwargs.data_files`` pointing at those files — the same items in the same order, so
every other line of lm-eval's config (prompt, few-shot split and sampler, stop sequences, filters,
metrics) applies unchanged, with or without a network. Always, not only offline: the numbers then
never depend on whether the hub answered. The hub's MBPP ``full`` splits are task ids 601-974
(train), 11-510 (test), 511-600 (validation) and 1-10 (prompt), in file order; they are written
once as JSON Lines under ``$RLKIT_CACHE/harness-data`` (``local_data=false`` reads the hub instead).

**Any other task** is lm-eval's, online: its dataset comes from the hub or the local datasets
cache; offline and not cached, it is refused in one line before the model loads.

**Code tasks** (``unsafe_code: true``): the functions their YAML names from a ``utils.py`` that loads
HF ``evaluate``'s ``code_eval`` come from :func:`rlkit.harness.code_exec.load_task_module` (the same
file, run with code_eval replaced by the sandbox); a code task scored any other way is refused.

A task's config is read with its ``!function`` tags left as references (:class:`FunctionRef`),
rewritten, resolved, and handed to lm-eval's ``TaskManager`` as an inline config under the task's
own name, so results are keyed as lm-eval keys them.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from rlkit.errors import ConfigError, DataError
from rlkit.files import atomic_write

#: (hub dataset, config) -> the rlkit-shipped copy that replaces it
GSM8K = ("openai/gsm8k", "main")
MBPP = ("google-research-datasets/mbpp", "full")
LOCAL_DATASETS = {GSM8K: "gsm8k", ("gsm8k", "main"): "gsm8k", MBPP: "mbpp", ("mbpp", "full"): "mbpp"}
#: the hub's MBPP "full" splits, by task id (the dataset's own loading script)
MBPP_SPLITS = {"train": (601, 974), "test": (11, 510), "validation": (511, 600), "prompt": (1, 10)}


@dataclass(frozen=True)
class FunctionRef:
    """A ``!function module.name`` tag of a task YAML in ``base_dir``, not yet imported."""

    base_dir: Path
    spec: str

    @property
    def module_file(self) -> Path:
        module = self.spec.rpartition(".")[0]
        return (self.base_dir / f"{module.replace('.', '/')}.py").resolve()


def read_task_yaml(path: Path, _seen: Optional[set] = None) -> Dict[str, Any]:
    """A task YAML as lm-eval's loader reads it (``include`` merged, local keys winning), with
    ``!function`` tags as :class:`FunctionRef`."""
    import yaml

    path = Path(path).resolve()
    seen = set() if _seen is None else _seen
    if path in seen:
        raise ConfigError(f"task config {path}: include cycle")
    seen.add(path)
    base = yaml.CSafeLoader if getattr(yaml, "__with_libyaml__", False) else yaml.SafeLoader

    class Loader(base):  # type: ignore[misc, valid-type]
        pass

    Loader.add_constructor("!function", lambda loader, node: FunctionRef(path.parent, loader.construct_scalar(node)))
    cfg = yaml.load(path.read_text(encoding="utf-8"), Loader=Loader)  # noqa: S506 - a SafeLoader subclass
    if not isinstance(cfg, dict):
        raise ConfigError(f"task config {path} is not a mapping")
    includes = cfg.pop("include", None)
    if includes is None:
        return cfg
    merged: Dict[str, Any] = {}
    for inc in includes if isinstance(includes, list) else [includes]:
        inc_cfg = read_task_yaml(Path(inc) if Path(inc).is_absolute() else path.parent / inc, seen)
        inc_cfg.pop("task_list", None)
        merged.update(inc_cfg)
    merged.update(cfg)
    return merged


def _walk(value: Any, fn: Any) -> Any:
    if isinstance(value, FunctionRef):
        return fn(value)
    if isinstance(value, dict):
        return {k: _walk(v, fn) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v, fn) for v in value]
    return value


def _refs(value: Any) -> List[FunctionRef]:
    found: List[FunctionRef] = []
    _walk(value, lambda ref: found.append(ref))
    return found


def resolve_functions(cfg: Dict[str, Any]) -> Tuple[Dict[str, Any], bool]:
    """``cfg`` with every :class:`FunctionRef` imported; ``True`` if its code runs in the sandbox
    (its functions come from a module that loads ``code_eval``)."""
    from lm_eval.tasks._yaml_loader import _import_func_in_yml

    from rlkit.harness import code_exec

    sandboxed = False

    def resolve(ref: FunctionRef) -> Any:
        nonlocal sandboxed
        if ref.module_file.is_file() and code_exec.uses_code_eval(ref.module_file):
            sandboxed = True
            return getattr(code_exec.load_task_module(ref.module_file), ref.spec.rpartition(".")[2])
        return _import_func_in_yml(ref.spec, ref.base_dir)

    return _walk(cfg, resolve), sandboxed


# -- the data rlkit ships ------------------------------------------------------------------------------


def _shipped(name: str) -> Path:
    from rlkit.data import SHIPPED_DATA

    return SHIPPED_DATA / name


def _mbpp_split_files() -> Dict[str, str]:
    """The hub's four MBPP ``full`` splits as JSON Lines files cut from the shipped ``mbpp.jsonl``
    (written once, atomically, under a name carrying the source file's digest)."""
    from rlkit.backends.local.models import cache_dir

    source = _shipped("mbpp") / "mbpp.jsonl"
    raw = source.read_bytes()
    folder = cache_dir() / "harness-data" / f"mbpp-{hashlib.sha256(raw).hexdigest()[:12]}"
    files = {split: folder / f"{split}.jsonl" for split in MBPP_SPLITS}
    if all(f.is_file() for f in files.values()):
        return {k: str(v) for k, v in files.items()}
    folder.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]
    for split, (lo, hi) in MBPP_SPLITS.items():
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows if lo <= int(r["task_id"]) <= hi)
        atomic_write(files[split], text)
    return {k: str(v) for k, v in files.items()}


def local_data_files(which: str) -> Dict[str, str]:
    """``data_files`` for the ``json`` builder: the shipped copy of dataset ``which`` by split."""
    if which == "gsm8k":
        return {split: str(_shipped("gsm8k") / f"{split}.jsonl") for split in ("train", "test")}
    if which == "mbpp":
        return _mbpp_split_files()
    raise KeyError(which)


def with_local_data(cfg: Dict[str, Any]) -> Optional[str]:
    """Point ``cfg`` at rlkit's copy of its dataset, if rlkit ships it; return which (else ``None``)."""
    which = LOCAL_DATASETS.get((cfg.get("dataset_path"), cfg.get("dataset_name")))
    if which is None:
        return None
    files = local_data_files(which)
    used = {}
    for split_key in ("training_split", "validation_split", "test_split", "fewshot_split"):
        split = cfg.get(split_key)
        if split is None:
            continue
        if split not in files:
            raise DataError(f"task {cfg.get('task')}: its {split_key} {split!r} is not among rlkit's {which} splits {sorted(files)}")
        used[split] = files[split]
    cfg["metadata"] = {**(cfg.get("metadata") or {}), "rlkit_local_data": f"{cfg['dataset_path']}/{cfg['dataset_name']}"}
    cfg["dataset_path"], cfg["dataset_name"] = "json", None
    # only the splits the task reads: JSON typing is per split (an MBPP split whose challenge tests
    # are all empty types them list<null>, which could not be joined with another split's list<string>)
    cfg["dataset_kwargs"] = {**(cfg.get("dataset_kwargs") or {}), "data_files": used}
    return which


# -- choosing and building tasks ---------------------------------------------------------------------


@dataclass
class Selection:
    """What ``tasks=`` named: lm-eval specs (inline configs or names) and what rlkit did to them."""

    specs: List[Any] = field(default_factory=list)
    local: Dict[str, str] = field(default_factory=dict)  # task -> shipped dataset it reads
    sandboxed: List[str] = field(default_factory=list)  # code tasks scored in the sandbox
    hub: List[str] = field(default_factory=list)  # tasks whose data comes from the hub (or its cache)


def suggestions(name: str, known: List[str]) -> str:
    """``"; did you mean: a, b?"`` — the nearest names (difflib), then lm-eval's own prefix matches."""
    import difflib

    from lm_eval.api.registry import _suggest_similar

    near = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    near += [s for s in _suggest_similar(name, known) if s not in near]
    return f"; did you mean: {', '.join(near[:4])}?" if near else ""


def select(catalog: Any, names: List[str], *, local_data: bool = True) -> Selection:
    """The lm-eval specs for ``names`` (globs as lm-eval matches them) from a
    :class:`~rlkit.harness.catalog.Catalog`; unknown names, and code tasks rlkit cannot sandbox,
    raise :class:`ConfigError` (one line)."""
    chosen = Selection()
    for name in names:
        matched = catalog.match(name)
        if not matched:
            raise ConfigError(f"unknown lm-eval task {name!r}{suggestions(name, catalog.names)} "
                              f"(all of them: python -m rlkit.harness ls tasks)")
        for task in matched:
            yaml_path = catalog.leaf_yaml(task)
            if yaml_path is None:
                chosen.specs.append(task)  # a group, tag or Python task: lm-eval's own, as named
                chosen.hub.append(task)
                continue
            chosen.specs.append(_task_config(task, read_task_yaml(yaml_path), chosen, local_data))
    return chosen


def _task_config(task: str, cfg: Dict[str, Any], chosen: Selection, local_data: bool) -> Dict[str, Any]:
    cfg["task"] = task
    which = with_local_data(cfg) if local_data else None
    if which:
        chosen.local[task] = which
    else:
        chosen.hub.append(task)
    if cfg.get("unsafe_code"):
        from rlkit.sandbox import ensure_available

        ensure_available()  # SandboxUnavailableError: one line, before anything loads
    resolved, sandboxed = resolve_functions(cfg)
    if resolved.get("unsafe_code"):
        if not sandboxed:
            raise ConfigError(f"task {task} executes model code with an executor rlkit does not know "
                              f"({', '.join(sorted({r.spec for r in _refs(cfg)})) or 'none named'}); "
                              f"rlkit eval runs model code only in its sandbox")
        chosen.sandboxed.append(task)
    return resolved


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether huggingface.co answers a TCP connect within ``timeout`` (``HF_HUB_OFFLINE=1``: no)."""
    import socket

    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes") or \
            os.environ.get("HF_DATASETS_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def go_offline() -> None:
    """Make ``datasets`` and ``huggingface_hub`` read only their local caches (no waiting on a network)."""
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    import datasets.config
    import huggingface_hub.constants

    datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = True
    huggingface_hub.constants.HF_HUB_OFFLINE = True


def build(catalog: Any, chosen: Selection, *, online: bool) -> List[Any]:
    """lm-eval's task and group objects for ``chosen``, their datasets loaded (inline configs by an
    empty ``TaskManager``; names of groups and tags by the catalog's full one); a dataset that
    cannot be had is one line naming the task."""
    from lm_eval.tasks import TaskManager

    inline = TaskManager(include_defaults=False, include_path=catalog.include_path)
    built: List[Any] = []
    for spec in chosen.specs:
        name = spec if isinstance(spec, str) else spec["task"]
        try:
            loaded = (inline if isinstance(spec, dict) else catalog.task_manager()).load([spec])
        except (ConfigError, DataError):
            raise
        except Exception as exc:  # noqa: BLE001 - datasets' and the hub's many errors: one line
            first = " ".join(str(exc).split())[:300] or type(exc).__name__
            where = first if online or name in chosen.local else \
                "the Hugging Face hub is not reachable and its local cache does not have it"
            raise DataError(f"task {name}: its data could not be loaded ({where}); rlkit ships GSM8K and MBPP "
                            f"(tasks over openai/gsm8k and google-research-datasets/mbpp run offline)") from None
        if name in loaded.get("groups", {}):
            built.append(loaded["groups"][name])
        else:
            built.extend(loaded["tasks"].values())
    return built
