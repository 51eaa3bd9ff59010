"""User code by dotted path: the one resolver behind every ``_target_`` and ``"module:function"``.

:func:`import_object` takes both spellings, ``package.module:attribute`` and
``package.module.attribute`` (an attribute may itself be dotted: ``mod:Class.factory``). User code
imports like user code in a Hydra app: when a module is not found on ``sys.path``, the working
directory and the project folders holding a user config tree (the parent of every ``--config-dir``;
``./configs``' parent is the working directory) are appended to ``sys.path`` and the import is
tried again, so ``loss._target_=my_losses.AsymmetricPPO`` finds ``./my_losses.py``. A failure is
one :class:`~rlkit.errors.ConfigError` line naming the module, the folders searched and the fix.

:func:`check_kwargs` checks a class's (or function's) keyword arguments before anything runs:
every key against the whole signature chain (an ``__init__(..., **kw)`` that forwards to its
parent's ``__init__`` is checked against the parent's, along the MRO), each value against its
annotation (or, unannotated, its default's type): coerced where that is lossless (``1`` for a
``float``, ``"0.5"`` for a number, ``"true"`` for a ``bool``), refused with one line otherwise. A
misspelt key gets the nearest match (:func:`suggest`).
"""

from __future__ import annotations

import difflib
import enum
import importlib
import inspect
import os
import sys
import typing
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Tuple

from rlkit.errors import ConfigError


def suggest(word: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the nearest of ``choices`` (empty when none is near)."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


# -- where user code lives -----------------------------------------------------------------------------


def user_paths() -> List[Path]:
    """The folders user code is imported from besides ``sys.path``: the working directory, then the
    parent of each ``--config-dir`` given to ``rlkit train``."""
    out = [Path.cwd()]
    search = sys.modules.get("rlkit.config_search")
    for d in getattr(search, "_extra_dirs", None) or []:
        out.append(Path(d).resolve().parent)
    unique: List[Path] = []
    for p in out:
        if p not in unique:
            unique.append(p)
    return unique


def ensure_user_paths() -> List[str]:
    """Append :func:`user_paths` to ``sys.path`` (after everything installed, so a project file
    never shadows a package); return the folders added."""
    present = {os.path.realpath(p or os.curdir) for p in sys.path}
    added = []
    for p in user_paths():
        if os.path.realpath(p) not in present:
            sys.path.append(str(p))
            added.append(str(p))
    if added:
        importlib.invalidate_caches()
    return added


# -- resolving a dotted path ---------------------------------------------------------------------------


def _import_module(name: str, where: str, path: str) -> Any:
    """``importlib.import_module(name)``, retried with the user's folders on ``sys.path``."""
    for attempt in range(2):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            missing = exc.name or ""
            if missing != name and not name.startswith(missing + "."):
                raise _failed(name, where, path, exc) from None  # the module was found; one of *its* imports was not
            if attempt == 0 and ensure_user_paths():
                continue
            raise _not_found(name, missing or name, where, path) from None
        except Exception as exc:  # noqa: BLE001 - user code failing at import time
            raise _failed(name, where, path, exc) from None
    raise AssertionError("unreachable")


def _prefix(where: str, path: str) -> str:
    return f"{where}={path!r}" if where else repr(path)


def _not_found(name: str, missing: str, where: str, path: str) -> ConfigError:
    folders = [str(p) for p in user_paths()]
    top = missing.split(".")[0]
    return ConfigError(
        f"{_prefix(where, path)}: cannot import module {missing!r} (no {top}.py or {top}/ in the working directory "
        f"{folders[0]}{', ' + ', '.join(folders[1:]) if folders[1:] else ''} or on sys.path); run from the folder that "
        f"holds {top}.py, or add its folder to PYTHONPATH (PYTHONPATH=/path/to/folder rlkit train ...)"
    )


def _failed(name: str, where: str, path: str, exc: BaseException) -> ConfigError:
    where_in = ""
    tb = exc.__traceback__
    while tb is not None:  # the innermost frame of the user's own code
        filename = tb.tb_frame.f_code.co_filename
        if not filename.startswith("<frozen"):
            where_in = f" ({filename}:{tb.tb_lineno})"
        tb = tb.tb_next
    if isinstance(exc, SyntaxError) and exc.filename:
        where_in = f" ({exc.filename}:{exc.lineno})"
    text = " ".join(str(exc).split())
    return ConfigError(f"{_prefix(where, path)}: importing module {name!r} failed: {type(exc).__name__}: {text}{where_in}")


def import_object(path: str, where: str = "") -> Any:
    """The object a dotted path names: ``"pkg.mod:attr"`` or ``"pkg.mod.attr"`` (see the module
    docstring). ``where`` names the config key in error messages (``loss._target_``)."""
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(f"{where or 'target'}: expected a dotted path like 'package.module.Name', got {path!r}")
    path = path.strip()
    if ":" in path:
        module_name, _, attr = path.partition(":")
        if not module_name or not attr:
            raise ConfigError(f"{_prefix(where, path)}: expected 'package.module:attribute' or 'package.module.attribute'")
        obj = _import_module(module_name, where, path)
        return _getattrs(obj, module_name, attr.split("."), where, path)
    parts = path.split(".")
    if len(parts) < 2 or not all(parts):
        raise ConfigError(f"{_prefix(where, path)}: expected 'package.module.Name' (or 'package.module:Name')")
    obj = _import_module(parts[0], where, path)
    for i in range(1, len(parts)):
        if hasattr(obj, parts[i]):
            obj = getattr(obj, parts[i])
            continue
        if not inspect.ismodule(obj):
            return _getattrs(obj, ".".join(parts[:i]), parts[i:], where, path)
        sub = ".".join(parts[: i + 1])
        try:
            obj = importlib.import_module(sub)
        except ModuleNotFoundError as exc:
            if exc.name != sub:
                raise _failed(sub, where, path, exc) from None
            return _getattrs(obj, ".".join(parts[:i]), parts[i:], where, path)
        except Exception as exc:  # noqa: BLE001 - user code failing at import time
            raise _failed(sub, where, path, exc) from None
    return obj


def lookup(spec: Dict[str, Any], registry: Mapping[str, Any], where: str, what: str, *, keep_name: bool = False) -> Any:
    """What a ``{name | _target_, **options}`` config names, both keys taken out of ``spec`` (which
    keeps the options): its ``_target_`` imported (:func:`import_object`), else its ``name`` looked
    up in ``registry``, an entry that is a ``"module:attr"`` string imported when used. ``name``
    stays in ``spec`` beside a ``_target_`` with ``keep_name`` (a tool's name is one of its options).
    An unknown name is one ``ConfigError`` line: ``{where}.name='x': unknown {what}; choose from
    [...] or set {where}._target_``, with the nearest name."""
    target = spec.pop("_target_", None)
    if target is not None:
        if not keep_name:
            spec.pop("name", None)
        return import_object(target, f"{where}._target_")
    name = spec.pop("name", None)
    if not isinstance(name, str) or name not in registry:
        raise ConfigError(f"{where}.name={name!r}: unknown {what}; choose from {sorted(registry)} or set "
                          f"{where}._target_{suggest(name, registry)}")
    found = registry[name]
    return import_object(found, f"{where}.name={name!r}") if isinstance(found, str) else found


def _getattrs(obj: Any, owner: str, attrs: List[str], where: str, path: str) -> Any:
    for attr in attrs:
        if not hasattr(obj, attr):
            names = [n for n in dir(obj) if not n.startswith("_")]
            raise ConfigError(f"{_prefix(where, path)}: {owner!r} has no attribute {attr!r}{suggest(attr, names)}")
        obj = getattr(obj, attr)
        owner = f"{owner}.{attr}"
    return obj


# -- checking keyword arguments ------------------------------------------------------------------------


def _hints(fn: Any) -> Dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - an annotation we cannot evaluate is not checked
        return {}


def _forwards(fn: Any) -> bool:
    """Whether an ``__init__(..., **kw)`` passes its keywords on (calls some ``__init__``)."""
    code = getattr(fn, "__code__", None)
    return code is None or "__init__" in code.co_names


def parameters(target: Any) -> Tuple[Dict[str, Tuple[inspect.Parameter, Any, str]], bool]:
    """``({name: (parameter, annotation, owner name)}, open)`` for calling ``target`` with keywords:
    a class's ``__init__`` chain along its MRO (a ``**kw`` that forwards continues into the parent's),
    or a function's signature. ``open`` is true when some ``**kw`` takes arbitrary keys."""
    found: Dict[str, Tuple[inspect.Parameter, Any, str]] = {}
    if inspect.isclass(target):
        chain = [k for k in target.__mro__ if "__init__" in vars(k) and k is not object]
        if not chain:
            return found, False
        for klass in chain:
            init = vars(klass)["__init__"]
            try:
                sig = inspect.signature(init)
            except (TypeError, ValueError):
                return found, True
            var_kw = _collect(sig, _hints(init), klass.__name__, found, skip_first=True)
            if not var_kw:
                return found, False
            if not _forwards(init):
                return found, True
        return found, False  # the last **kw goes to object.__init__, which takes none
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return found, True
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or repr(target)
    return found, _collect(sig, _hints(target), name, found, skip_first=False)


def _collect(sig: inspect.Signature, hints: Mapping[str, Any], owner: str, found: Dict[str, Any], *, skip_first: bool) -> bool:
    var_kw = False
    for i, p in enumerate(sig.parameters.values()):
        if skip_first and i == 0:
            continue
        if p.kind is p.VAR_KEYWORD:
            var_kw = True
        elif p.kind is not p.VAR_POSITIONAL and p.kind is not p.POSITIONAL_ONLY and p.name not in found:
            found[p.name] = (p, hints.get(p.name, p.annotation), owner)
    return var_kw


def check_kwargs(
    target: Any, kwargs: Mapping[str, Any], where: str, *, ignore: Iterable[str] = (), require_all: bool = True
) -> Dict[str, Any]:
    """``kwargs`` checked against ``target``'s signature chain (see the module docstring), values
    coerced to their annotated types; raises a one-line :class:`ConfigError` naming ``where.key``."""
    params, open_kw = parameters(target)
    name = getattr(target, "__name__", None) or repr(target)
    out: Dict[str, Any] = {}
    for key, value in kwargs.items():
        if key in ignore:
            out[key] = value
            continue
        if key not in params:
            if open_kw:
                out[key] = value
                continue
            accepted = list(params)
            raise ConfigError(f"{where}.{key}: not a parameter of {name} (accepts {accepted}){suggest(key, accepted)}")
        p, annotation, owner = params[key]
        out[key] = coerce(value, annotation, p.default, f"{where}.{key}", f"{owner}'s {key}")
    missing = [k for k, (p, _, _) in params.items() if p.default is p.empty and p.kind is not p.VAR_POSITIONAL and k not in kwargs]
    if missing and require_all:
        raise ConfigError(f"{where}: {name} needs {missing[0]!r} (set +{where}.{missing[0]}=...)")
    return out


_NUMBER = object()  # "int or float", inferred from an unannotated numeric default


def coerce(value: Any, annotation: Any, default: Any, key: str, what: str) -> Any:
    """``value`` as ``annotation`` (or its default's type) asks, or a one-line ConfigError."""
    expected = annotation
    if expected is inspect.Parameter.empty or isinstance(expected, str):
        if isinstance(default, bool):
            expected = bool
        elif isinstance(default, (int, float)):
            expected = _NUMBER
        else:
            return value
    try:
        return _coerce(value, expected)
    except _Refused as exc:
        shown = "a number" if expected is _NUMBER else exc.args[0]
        raise ConfigError(f"{key}={value!r}: expected {shown} ({what})") from None


class _Refused(Exception):
    pass


def _describe(tp: Any) -> str:
    named = {float: "a float", int: "an integer", bool: "true or false", str: "a string"}
    return named.get(tp) or getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _parsed(value: Any, parse: Callable[[str], Any], wanted: str) -> Any:
    """A number written as a string (``"0.5"``, ``"3"``) parsed, or ``_Refused(wanted)``."""
    if isinstance(value, str):
        try:
            return parse(value)
        except ValueError:
            pass
    raise _Refused(wanted)


def _coerce(value: Any, tp: Any) -> Any:  # noqa: C901 - one case per kind of annotation
    if tp is Any or tp is inspect.Parameter.empty or tp is object:
        return value
    if tp is _NUMBER:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        return _parsed(value, float, "a number")
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union or type(tp).__name__ == "UnionType":
        if value is None and type(None) in args:
            return None
        for option in [a for a in args if a is not type(None)]:
            try:
                return _coerce(value, option)
            except _Refused:
                continue
        raise _Refused(" or ".join(_describe(a) for a in args if a is not type(None)) + (" (or null)" if type(None) in args else ""))
    if origin is typing.Literal:
        if value in args:
            return value
        raise _Refused(f"one of {list(args)}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        return _parsed(value, float, "a float")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return _parsed(value, int, "an integer")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise _Refused("true or false")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise _Refused("a string")
    if inspect.isclass(tp) and issubclass(tp, enum.Enum):
        if isinstance(value, tp):
            return value
        for member in tp:
            if value in (member.value, member.name):
                return member
        raise _Refused(f"one of {[m.value for m in tp]}")
    container = origin or tp
    if container in (list, tuple, set, frozenset) or container in (typing.Sequence, getattr(typing, "List", None)):
        if isinstance(value, (list, tuple)):
            return value
        raise _Refused("a list")
    if inspect.isclass(container):
        import collections.abc as abc

        if issubclass(container, abc.Mapping) or container is dict:
            if isinstance(value, Mapping):
                return value
            raise _Refused("a mapping")
        if issubclass(container, (abc.Sequence,)) and not issubclass(container, str):
            if isinstance(value, (list, tuple)):
                return value
            raise _Refused("a list")
    return value  # any other class: the constructor judges


def check_target_spec(spec: Any, where: str) -> None:
    """A Hydra-style ``{_target_: ..., **kwargs}`` (and any nested one) resolved and its keywords
    checked, without calling anything."""
    if isinstance(spec, Mapping):
        target = spec.get("_target_")
        for key, value in spec.items():
            if not str(key).startswith("_"):
                check_target_spec(value, f"{where}.{key}")
        if isinstance(target, str):
            obj = import_object(target, f"{where}._target_")
            kwargs = {k: v for k, v in spec.items() if not str(k).startswith("_")}
            check_kwargs(obj, kwargs, where, require_all="_args_" not in spec and not spec.get("_partial_"))
    elif isinstance(spec, (list, tuple)):
        for i, item in enumerate(spec):
            check_target_spec(item, f"{where}[{i}]")


__all__ = ["check_kwargs", "check_target_spec", "coerce", "ensure_user_paths", "import_object", "lookup", "parameters", "suggest",
           "user_paths"]
