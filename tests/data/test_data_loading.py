"""rlkit.data: sources (JSONL, JSON, parquet, datasets.Dataset, list, HF id with fallback), schema
errors naming file and row, data roots, conversation building, token-budget batching."""

import json
import logging

import pytest

from rlkit.config import DatasetConfig
from rlkit.data import (
    TokenBatcher,
    conversation_builder,
    data_roots,
    gsm8k_messages,
    load_records,
    resolve_path,
)
from rlkit.errors import DataError

SCHEMA = {"question": str, "answer": str}
ROWS = [{"question": f"q{i}", "answer": f"a{i} #### {i}"} for i in range(5)]


def write_jsonl(path, rows, extra_lines=()):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "".join(extra_lines))
    return path


def test_jsonl_records_and_slice(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    assert load_records(str(path), schema=SCHEMA) == ROWS
    cfg = DatasetConfig(path=str(path), start=1, limit=2)
    assert load_records(cfg, schema=SCHEMA) == ROWS[1:3]
    where = []
    load_records(str(path), schema=SCHEMA, locations=where)
    assert where[2] == f"{path}:3"


def test_json_list_and_parquet_and_dataset_and_list(tmp_path):
    import datasets

    (tmp_path / "d.json").write_text(json.dumps(ROWS))
    assert load_records(str(tmp_path / "d.json"), schema=SCHEMA) == ROWS
    ds = datasets.Dataset.from_list(ROWS)
    assert load_records(ds, schema=SCHEMA) == ROWS
    ds.to_parquet(str(tmp_path / "d.parquet"))
    assert load_records(str(tmp_path / "d.parquet"), schema=SCHEMA) == ROWS
    assert load_records(list(ROWS), schema=SCHEMA, limit=1) == ROWS[:1]


def test_malformed_jsonl_row_names_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", ROWS[:2], ['{"question": "q", "answer": \n'])
    with pytest.raises(DataError, match=r"bad\.jsonl:3: not valid JSON"):
        load_records(str(path), schema=SCHEMA)


@pytest.mark.parametrize(
    "row, message",
    [
        ({"question": "q"}, r"bad\.jsonl:2: missing field 'answer'"),
        ({"question": "q", "answer": 7}, r"bad\.jsonl:2: field 'answer' must be str, got int"),
        (["not", "an", "object"], r"bad\.jsonl:2: expected a JSON object, got list"),
    ],
)
def test_schema_errors_name_file_and_row(tmp_path, row, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [ROWS[0], row])
    with pytest.raises(DataError, match=message):
        load_records(str(path), schema=SCHEMA)


def test_missing_file_and_empty_dataset(tmp_path):
    with pytest.raises(DataError, match=r"data file 'nope/missing\.jsonl' not found"):
        load_records("nope/missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="is empty"):
        load_records(str(tmp_path / "empty.jsonl"), name="data.train")
    with pytest.raises(DataError, match="is empty"):
        load_records([], name="data.train")
    with pytest.raises(DataError, match="unsupported data file type"):
        (tmp_path / "d.csv").write_text("a,b\n")
        load_records(str(tmp_path / "d.csv"))


def test_hub_id_falls_back_to_local_file_with_a_note(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    path = write_jsonl(tmp_path / "fallback.jsonl", ROWS)
    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("rlkit.data")
    logger.addHandler(handler)
    try:
        got = load_records(DatasetConfig(hf_id="no-such-org/no-such-dataset", path=str(path)), schema=SCHEMA)
    finally:
        logger.removeHandler(handler)
    assert got == ROWS
    assert any("no-such-org/no-such-dataset" in m and "fallback.jsonl" in m for m in messages)
    with pytest.raises(DataError, match="cannot load Hugging Face dataset 'no-such-org/no-such-dataset'"):
        load_records(DatasetConfig(hf_id="no-such-org/no-such-dataset"))


def test_data_roots_find_shared_gsm8k_from_anywhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RLKIT_DATA", raising=False)
    path = resolve_path("gsm8k/test.jsonl")  # found above the installed package: ../shared/data
    assert path.name == "test.jsonl" and path.parent.name == "gsm8k"
    (tmp_path / "mydata" / "x").mkdir(parents=True)
    write_jsonl(tmp_path / "mydata" / "x" / "f.jsonl", ROWS)
    monkeypatch.setenv("RLKIT_DATA", str(tmp_path / "mydata"))
    assert data_roots()[0] == tmp_path / "mydata"
    assert load_records("x/f.jsonl", schema=SCHEMA) == ROWS


def test_conversation_builders():
    build, schema = conversation_builder({"prompt_field": "question", "completion_field": "answer", "system_prompt": "Be brief."})
    assert schema == {"question": str, "answer": str}
    assert build(ROWS[0]) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "q0"},
        {"role": "assistant", "content": "a0 #### 0"},
    ]
    build, schema = conversation_builder({"transform": "rlkit.data:gsm8k_messages"})
    assert schema == {"question": str, "answer": str}
    msgs = build({"question": "How many?", "answer": "48/2 = <<48/2=24>>24 clips.\n#### 24"})
    assert msgs[1]["content"] == "48/2 = 24 clips.\n#### 24"
    assert gsm8k_messages({"question": "q", "answer": "a"})[0] == {"role": "user", "content": "q"}
    build, schema = conversation_builder({"messages_field": "messages"})
    assert schema == {"messages": list}


def test_token_batcher_budget_determinism_and_resume():
    lengths = [5, 3, 9, 2, 7, 4, 12, 1, 6, 8]
    b = TokenBatcher(len(lengths), lengths.__getitem__, budget=10, seed=3)
    stream = [b.next_batch() for _ in range(12)]
    for batch in stream:
        assert sum(lengths[i] for i in batch) <= 10 or len(batch) == 1
    epoch0 = [i for batch in stream[: b.batches_per_epoch()] for i in batch]
    assert sorted(epoch0) == list(range(10))  # an epoch covers every example once
    again = TokenBatcher(len(lengths), lengths.__getitem__, budget=10, seed=3)
    assert [again.next_batch() for _ in range(12)] == stream
    resumed = TokenBatcher(len(lengths), lengths.__getitem__, budget=10, seed=3)
    first = TokenBatcher(len(lengths), lengths.__getitem__, budget=10, seed=3)
    for _ in range(5):
        first.next_batch()
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert [resumed.next_batch() for _ in range(7)] == stream[5:]
    other = TokenBatcher(len(lengths), lengths.__getitem__, budget=10, seed=4)
    assert [other.next_batch() for _ in range(12)] != stream
