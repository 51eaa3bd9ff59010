"""Loaders for code benchmarks, normalised to the problem records :class:`CodeExecutionReward` reads.

* MBPP (HF ``google-research-datasets/mbpp``, configs ``full`` and ``sanitized``): local
  ``mbpp.jsonl`` / ``sanitized-mbpp.json`` files, a split name resolved against a data directory,
  or any iterable of row dicts (e.g. a ``datasets.Dataset``). Records:
  ``{"task_id", "prompt", "code", "test_list", "test_setup_code", "challenge_test_list"}``.
* CodeContests (HF ``deepmind/code_contests``): the local JSON array of
  ``{"problem", "tests": {"inputs", "outputs"}}`` or HF rows (``description``,
  ``public_tests``/``private_tests``/``generated_tests`` with ``input``/``output`` lists,
  ``time_limit``, ``memory_limit_bytes``). Records: ``{"problem", "tests", "name",
  "time_limit_s", "memory_limit_bytes"}``, plus ``num_public_tests`` for HF rows (the public
  tests are the first ones of ``tests``).

Loading straight from the Hub is left to the caller: ``load_mbpp(datasets.load_dataset(
"google-research-datasets/mbpp", "full", split="test"))`` works, as does any list of dicts.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Iterable, Mapping, Optional, Union

from rlkit.errors import DataError

# task_id ranges of the MBPP splits (the same for the full and the sanitized set)
MBPP_SPLITS = {"prompt": (1, 10), "test": (11, 510), "validation": (511, 600),
               "train": (601, 974)}

Source = Union[str, os.PathLike, Iterable[Mapping[str, Any]]]


def _data_dir(data_dir: Optional[str]) -> str:
    """``data_dir``, else the data root that holds ``mbpp/`` (see :func:`rlkit.data.resolve_path`)."""
    if data_dir:
        return str(data_dir)
    from rlkit.data import resolve_path

    return str(resolve_path("mbpp/mbpp.jsonl").parent.parent)


def _read_rows(path: str) -> list[dict]:
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith(".jsonl"):
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as exc:
                    raise DataError(f"{path}:{n}: not JSON ({exc})") from None
        return rows
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise DataError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON array of problems")
    return data


def _lf(text: Any) -> str:
    return str(text or "").replace("\r\n", "\n")


def _mbpp_record(row: Mapping[str, Any], where: str) -> dict:
    try:
        tests = [_lf(t) for t in row["test_list"]]
        prompt = row.get("text", row.get("prompt"))
        if prompt is None:
            raise KeyError("text/prompt")
        return {
            "task_id": row["task_id"],
            "prompt": _lf(prompt),
            "code": _lf(row.get("code")),
            "test_list": tests,
            "test_setup_code": _lf(row.get("test_setup_code"))
            or "\n".join(row.get("test_imports") or []),
            "challenge_test_list": [_lf(t) for t in row.get("challenge_test_list") or []],
        }
    except (KeyError, TypeError) as exc:
        raise DataError(f"{where}: not an MBPP row (missing {exc})") from None


def load_mbpp(source: Source = "test", *, data_dir: Optional[str] = None) -> list[dict]:
    """MBPP problems from a file path, a split name, or an iterable of rows.

    Split names: ``full`` (all 974), ``prompt``/``test``/``validation``/``train`` (task_id
    ranges of the full set), ``sanitized`` and ``sanitized-<split>`` (the 427 hand-checked
    problems). Names resolve against ``data_dir`` or the data roots of :mod:`rlkit.data` (files
    ``mbpp/mbpp.jsonl`` and ``mbpp/sanitized-mbpp.json``; the project ships them).
    """
    split = None
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        name = path.lower()
        if name in MBPP_SPLITS or name == "full" or name.startswith("sanitized") and "." not in name:
            sanitized = name.startswith("sanitized")
            split = name.split("-", 1)[1] if sanitized and "-" in name else (
                None if sanitized or name == "full" else name)
            if split is not None and split not in MBPP_SPLITS:
                raise DataError(f"unknown MBPP split {split!r}; expected one of {list(MBPP_SPLITS)}")
            fname = "sanitized-mbpp.json" if sanitized else "mbpp.jsonl"
            path = os.path.join(_data_dir(data_dir), "mbpp", fname)
        rows, where = _read_rows(path), path
    else:
        rows, where = list(source), "MBPP rows"
    out = [_mbpp_record(row, f"{where}[{i}]") for i, row in enumerate(rows)]
    if split is not None:
        lo, hi = MBPP_SPLITS[split]
        out = [r for r in out if lo <= int(r["task_id"]) <= hi]
    return out


_TIME = re.compile(r"Time Limit:\s*\{'seconds':\s*(\d+),\s*'nanos':\s*(\d+)\}")
_MEMORY = re.compile(r"Memory Limit:\s*(\d+)\s*Bytes")


def _tests_from(row: Mapping[str, Any], include: Iterable[str]) -> dict:
    if isinstance(row.get("tests"), Mapping):
        tests = row["tests"]
        return {"inputs": list(tests["inputs"]), "outputs": list(tests["outputs"])}
    inputs, outputs = [], []
    for part in include:
        block = row.get(f"{part}_tests") or {}
        inputs += list(block.get("input") or [])
        outputs += list(block.get("output") or [])
    return {"inputs": inputs, "outputs": outputs}


def load_codecontests(source: Source, *,
                      include: Iterable[str] = ("public", "private")) -> list[dict]:
    """CodeContests problems from the local JSON file or HF ``deepmind/code_contests`` rows.

    ``include`` picks which HF test splits to concatenate (``public``, ``private``,
    ``generated``); the local file already holds public + private tests.
    """
    if isinstance(source, (str, os.PathLike)):
        rows, where = _read_rows(os.fspath(source)), os.fspath(source)
    else:
        rows, where = list(source), "CodeContests rows"
    include = tuple(include)
    out = []
    for i, row in enumerate(rows):
        statement = row.get("problem", row.get("description")) if isinstance(row, Mapping) else None
        if statement is None:
            raise DataError(f"{where}[{i}]: not a CodeContests row (no 'problem'/'description')")
        try:
            tests = _tests_from(row, include)
        except (KeyError, TypeError) as exc:
            raise DataError(f"{where}[{i}]: malformed tests ({exc})") from None
        if len(tests["inputs"]) != len(tests["outputs"]):
            raise DataError(f"{where}[{i}]: {len(tests['inputs'])} inputs but "
                            f"{len(tests['outputs'])} outputs")
        time_limit = row.get("time_limit")
        if isinstance(time_limit, Mapping):
            seconds = time_limit.get("seconds", 0) + time_limit.get("nanos", 0) / 1e9
        else:
            m = _TIME.search(statement)
            seconds = int(m.group(1)) + int(m.group(2)) / 1e9 if m else None
        memory = row.get("memory_limit_bytes")
        if memory is None:
            m = _MEMORY.search(statement)
            memory = int(m.group(1)) if m else None
        record = {"problem": statement, "tests": tests, "name": row.get("name"),
                  "time_limit_s": seconds or None, "memory_limit_bytes": memory or None}
        if include[:1] == ("public",) and isinstance(row.get("public_tests"), Mapping):
            # HF rows: the public (statement) tests come first; say how many there are
            record["num_public_tests"] = len(row["public_tests"].get("input") or [])
        out.append(record)
    return out
