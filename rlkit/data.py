"""Datasets for the loops: records (plain dicts) from a Hugging Face dataset id, a local
JSONL/JSON/parquet file, or an in-memory ``datasets.Dataset`` / list — checked against a schema.

    records = load_records(cfg.data.train, schema={"question": str, "answer": str})

- **Sources** (:func:`load_records`): a :class:`~rlkit.config.DatasetConfig`-like object
  (``hf_id``/``hf_config``/``split`` tried first when set, else ``path``; when the hub load fails
  and ``path`` is set, the file is used and a note is logged), a path, a ``datasets.Dataset``, or a
  list of dicts. ``start``/``limit`` select a slice (files are read only as far as needed).
- **Paths** (:func:`resolve_path`): absolute; relative to the working directory; or relative to a
  data root: ``$RLKIT_DATA``, then every ``shared/data`` folder above the working directory and
  above the installed package, then the copies the package ships in ``rlkit/assets/data`` (GSM8K,
  MBPP, CodeContests; so ``gsm8k/train.jsonl`` resolves with no network and no configuration).
- **Errors** are :class:`~rlkit.errors.DataError` with one line naming the file and the 1-based
  row (line number for JSONL): a missing file, a malformed JSON line, a missing field or a field of
  the wrong type, an empty dataset.

Also here: :func:`conversation_builder` (record -> chat messages, from field names or a
``"module:function"`` transform), :func:`gsm8k_messages` (the GSM8K worked-solution format), and
:class:`TokenBatcher` (deterministic, resumable batches by token budget over shuffled epochs).
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from rlkit.errors import DataError

log = logging.getLogger("rlkit.data")

Record = Dict[str, Any]
Schema = Mapping[str, Union[type, Tuple[type, ...]]]
DATA_ENV = "RLKIT_DATA"
#: GSM8K, MBPP and CodeContests files shipped with the package (byte-identical copies, see its README)
SHIPPED_DATA = Path(__file__).resolve().parent / "assets" / "data"
_TYPE_NAMES = {str: "str", int: "int", float: "float", bool: "bool", list: "list", dict: "dict"}


# -- where files are ---------------------------------------------------------------------------------


def data_roots() -> List[Path]:
    """Folders searched for relative data paths, in order (see the module docstring)."""
    roots: List[Path] = []
    env = os.environ.get(DATA_ENV)
    if env:
        roots.extend(Path(p).expanduser() for p in env.split(os.pathsep) if p)
    for start in (Path.cwd(), Path(__file__).resolve().parent):
        for folder in (start, *start.parents):
            candidate = folder / "shared" / "data"
            if candidate.is_dir() and candidate not in roots:
                roots.append(candidate)
    roots.append(SHIPPED_DATA)  # the copies the package ships: a fresh machine with no network still runs
    return roots


def _a_file(p: Path, given: Union[str, Path]) -> Path:
    if p.is_dir():
        raise DataError(f"data file {str(given)!r} is a directory ({p}); name a .jsonl, .json or .parquet file in it")
    return p


def resolve_path(path: Union[str, Path]) -> Path:
    """The file ``path`` names (see the module docstring); :class:`DataError` if there is none."""
    p = Path(path).expanduser()
    if p.is_absolute():
        if p.exists():
            return _a_file(p, path)
        raise DataError(f"data file {str(path)!r} not found")
    if p.exists():
        return _a_file(p.resolve(), path)
    roots = data_roots()
    for root in roots:
        if (root / p).exists():
            return _a_file((root / p).resolve(), path)
    looked = ", ".join(str(r) for r in [Path.cwd(), *roots])
    raise DataError(f"data file {str(path)!r} not found (looked in {looked}; set {DATA_ENV} to the folder that holds it)")


# -- reading -------------------------------------------------------------------------------------------


def _describe(t: Union[type, Tuple[type, ...]]) -> str:
    types = t if isinstance(t, tuple) else (t,)
    return " or ".join(_TYPE_NAMES.get(x, x.__name__) for x in types)


def check_record(record: Any, schema: Optional[Schema], where: str) -> Record:
    """``record`` if it is a mapping holding every field of ``schema`` with the right type."""
    if not isinstance(record, Mapping):
        raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for key, expected in (schema or {}).items():
        if key not in record:
            raise DataError(f"{where}: missing field {key!r} (has {', '.join(sorted(map(str, record))) or 'no fields'})")
        value = record[key]
        ok = isinstance(value, expected) and not (isinstance(value, bool) and bool not in (expected if isinstance(expected, tuple) else (expected,)))
        if not ok:
            raise DataError(f"{where}: field {key!r} must be {_describe(expected)}, got {type(value).__name__}")
    return dict(record)


def _lines(path: Path) -> Iterator[Tuple[int, str]]:
    """``(line number, text)`` of a UTF-8 file; a byte that is not UTF-8 is a DataError naming the line."""
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                yield lineno, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})") from None


def _iter_jsonl(path: Path) -> Iterator[Tuple[str, Any]]:
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        try:
            yield f"{path}:{lineno}", json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{lineno}: not valid JSON ({exc.msg} at column {exc.colno})") from None


def _iter_json(path: Path) -> Iterator[Tuple[str, Any]]:
    text = "".join(line for _, line in _lines(path))
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":  # JSON lines saved as .json (the Hugging Face convention)
            yield from _iter_jsonl(path)
            return
        raise DataError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if isinstance(data, Mapping):  # {"data": [...]} or {"train": [...]}: the single list inside
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise DataError(f"{path}: expected a JSON list of records (or an object holding exactly one list)")
        data = lists[0]
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
    for i, row in enumerate(data, start=1):
        yield f"{path}: record {i}", row


def _iter_parquet(path: Path) -> Iterator[Tuple[str, Any]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # noqa: BLE001 - any reader failure is a data error
        raise DataError(f"{path}: cannot read parquet ({str(exc).splitlines()[0]})") from None
    for i, row in enumerate(table.to_pylist(), start=1):
        yield f"{path}: row {i}", row


def _iter_file(path: Path) -> Iterator[Tuple[str, Any]]:
    suffixes = "".join(path.suffixes[-2:]).lower()
    if suffixes.endswith((".jsonl", ".ndjson")):
        return _iter_jsonl(path)
    if suffixes.endswith(".json"):
        return _iter_json(path)
    if suffixes.endswith((".parquet", ".pq")):
        return _iter_parquet(path)
    raise DataError(f"{path}: unsupported data file type (expected .jsonl, .json or .parquet)")


def _iter_rows(rows: Sequence[Any], name: str) -> Iterator[Tuple[str, Any]]:
    for i, row in enumerate(rows, start=1):
        yield f"{name} row {i}", row


def _load_hub(hf_id: str, hf_config: Optional[str], split: str):
    import datasets

    return datasets.load_dataset(hf_id, hf_config, split=split)


def _field(source: Any, name: str, default: Any = None) -> Any:
    if isinstance(source, Mapping):
        return source.get(name, default)
    return getattr(source, name, default)


def load_records(
    source: Any,
    *,
    schema: Optional[Schema] = None,
    start: Optional[int] = None,
    limit: Optional[int] = None,
    name: str = "dataset",
    locations: Optional[List[str]] = None,
) -> List[Record]:
    """Records of ``source`` (see the module docstring), each checked against ``schema``.

    ``locations``, when given, receives a "file:line" / "file: row N" string per record, for
    errors found later (e.g. while rendering a conversation)."""
    rows: Iterator[Tuple[str, Any]]
    if source is None:
        raise DataError(f"{name}: no data source configured (set a path or an hf_id)")
    if isinstance(source, (str, Path)):
        rows = _iter_file(resolve_path(source))
    elif isinstance(source, list):
        rows = _iter_rows(source, name)
    elif type(source).__name__ in ("Dataset", "IterableDataset") and hasattr(source, "features"):
        rows = _iter_rows(source, name)  # a datasets.Dataset iterates as dicts
    else:  # a DatasetConfig / DictConfig / mapping
        path, hf_id = _field(source, "path"), _field(source, "hf_id")
        start = _field(source, "start", 0) if start is None else start
        limit = _field(source, "limit") if limit is None else limit
        if hf_id:
            split = _field(source, "split", "train")
            try:
                dataset = _load_hub(hf_id, _field(source, "hf_config"), split)
                rows = _iter_rows(dataset, f"{hf_id}[{split}]")
            except Exception as exc:  # noqa: BLE001 - offline, unknown id, ...: fall back or report
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                if not path:
                    raise DataError(f"{name}: cannot load Hugging Face dataset {hf_id!r} ({reason}); set a local path as fallback") from None
                log.warning("note: %s: Hugging Face dataset %r unavailable (%s); using %s", name, hf_id, reason, path)
                rows = _iter_file(resolve_path(path))
        elif path:
            rows = _iter_file(resolve_path(path))
        else:
            raise DataError(f"{name}: no data source configured (set a path or an hf_id)")
    start = int(start or 0)
    records: List[Record] = []
    found: List[str] = []
    count = 0
    for index, (where, row) in enumerate(rows):
        count += 1
        if index < start:
            continue
        if limit is not None and len(records) >= limit:
            break
        records.append(check_record(row, schema, where))
        found.append(where)
    if not records:
        detail = f" (after skipping {start} of {count})" if start else ""
        raise DataError(f"{name}: the dataset {_source_name(source)} is empty{detail}")
    if locations is not None:
        locations.extend(found)
    return records


def _source_name(source: Any) -> str:
    if isinstance(source, (str, Path)):
        return repr(str(source))
    if isinstance(source, list) or hasattr(source, "features"):
        return "given"
    return repr(_field(source, "hf_id") or _field(source, "path"))


# -- records -> conversations ----------------------------------------------------------------------------


Messages = List[Dict[str, str]]


def conversation_builder(fmt: Any) -> Tuple[Callable[[Record], Messages], Schema]:
    """A function record -> chat messages, and the schema its records must satisfy.

    ``fmt`` has ``messages_field`` (records hold messages), or ``prompt_field`` /
    ``completion_field`` (+ optional ``system_prompt``), or ``transform`` ("module:function").
    """
    transform = _field(fmt, "transform")
    system = _field(fmt, "system_prompt")
    if transform:
        from rlkit.config import import_string

        fn = import_string(transform)
        schema = getattr(fn, "schema", None) or {}
        if system:
            return (lambda r: [{"role": "system", "content": system}, *fn(r)]), schema
        return fn, schema
    messages_field = _field(fmt, "messages_field")
    if messages_field:
        return (lambda r: list(r[messages_field])), {messages_field: list}
    prompt, completion = _field(fmt, "prompt_field", "prompt"), _field(fmt, "completion_field", "completion")

    def build(record: Record) -> Messages:
        turns = [{"role": "user", "content": record[prompt]}, {"role": "assistant", "content": record[completion]}]
        return ([{"role": "system", "content": system}] if system else []) + turns

    return build, {prompt: str, completion: str}


_CALCULATOR = re.compile(r"<<[^<>]*>>")


def gsm8k_solution(answer: str) -> str:
    """A GSM8K reference solution without its ``<<48/2=24>>`` calculator annotations; the final
    ``#### N`` line is kept (it is what :func:`rlkit.rewards.math.extract_answer` reads)."""
    return _CALCULATOR.sub("", answer)


def gsm8k_messages(record: Record) -> Messages:
    """GSM8K ``{question, answer}`` -> user question, assistant worked solution ending ``#### N``."""
    return [
        {"role": "user", "content": record["question"]},
        {"role": "assistant", "content": gsm8k_solution(record["answer"])},
    ]


gsm8k_messages.schema = {"question": str, "answer": str}  # type: ignore[attr-defined]


# -- batching ----------------------------------------------------------------------------------------------


class TokenBatcher:
    """Batches of example indices whose token counts sum to at most ``budget`` (an example longer
    than the budget goes alone), over epochs of a shuffled order.

    The order of epoch ``e`` is ``random.Random(f"{seed}:{e}")``'s shuffle, so the whole stream is
    a function of ``(seed, lengths)`` and :meth:`state_dict` (epoch, position) restores it exactly.
    ``length(i)`` is called lazily, only for examples a batch reaches.
    """

    def __init__(self, size: int, length: Callable[[int], int], budget: int, *, seed: int = 0, shuffle: bool = True):
        if size < 1:
            raise DataError("cannot batch an empty dataset")
        if budget < 1:
            raise DataError(f"token budget {budget} must be positive")
        self.size, self.length, self.budget, self.seed, self.shuffle = size, length, budget, seed, shuffle
        self.epoch, self.position = 0, 0
        self._order: Tuple[int, List[int]] = (-1, [])

    def order(self, epoch: int) -> List[int]:
        if self._order[0] != epoch:
            order = list(range(self.size))
            if self.shuffle:
                random.Random(f"{self.seed}:{epoch}").shuffle(order)
            self._order = (epoch, order)
        return self._order[1]

    def next_batch(self) -> List[int]:
        if self.position >= self.size:
            self.epoch, self.position = self.epoch + 1, 0
        order = self.order(self.epoch)
        batch: List[int] = []
        used = 0
        while self.position < self.size:
            i = order[self.position]
            n = self.length(i)
            if batch and used + n > self.budget:
                break
            batch.append(i)
            used += n
            self.position += 1
        return batch

    def batches_per_epoch(self) -> int:
        """Batches in one epoch (renders every example once to know its length)."""
        count, used, first = 0, 0, True
        for i in self.order(0):
            n = self.length(i)
            if first or used + n > self.budget:
                count, used, first = count + 1, 0, False
            used += n
        return count

    @property
    def epoch_progress(self) -> float:
        return self.epoch + self.position / self.size

    def state_dict(self) -> Dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        if int(state.get("seed", self.seed)) != self.seed:
            raise DataError(f"data order was saved with seed {state['seed']}, this run has seed {self.seed}")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
