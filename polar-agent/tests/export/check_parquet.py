"""Loads a Polar Parquet export with pyarrow and Hugging Face `datasets`
(offline) and checks its columns and types; prints a JSON summary for the
Rust test to compare. Usage: check_parquet.py EXPORT_ROOT CACHE_DIR"""

import glob
import json
import os
import sys

os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

root, cache = sys.argv[1], sys.argv[2]
files = sorted(glob.glob(os.path.join(root, "**", "*.parquet"), recursive=True))
assert files, f"no Parquet file under {root}"


def lst(t):
    return pa.list_(pa.field("item", t, nullable=False))


EXPECTED = {
    "schema_version": pa.uint32(),
    "trace_id": pa.string(),
    "session_id": pa.string(),
    "task_id": pa.string(),
    "group_id": pa.string(),
    "attempt": pa.uint32(),
    "policy_version": pa.string(),
    "weight_version": pa.string(),
    "status": pa.string(),
    "error": pa.string(),
    "builder": pa.string(),
    "trace_index": pa.uint32(),
    "chain": pa.uint32(),
    "chain_role": pa.string(),
    "segment": pa.uint32(),
    "segment_kind": pa.string(),
    "break_reason": pa.string(),
    "labels": lst(pa.string()),
    "finish_reason": pa.string(),
    "reward": pa.float64(),
    "prompt_ids": lst(pa.uint32()),
    "response_ids": lst(pa.uint32()),
    "loss_mask": lst(pa.uint8()),
    "response_logprobs": lst(pa.float32()),
    "prompt_messages": pa.string(),
    "response_messages": pa.string(),
    "tools": pa.string(),
    "call_ids": lst(pa.string()),
    "trace_metadata": pa.string(),
    "trajectory_metadata": pa.string(),
    "stats": pa.string(),
    "off_policy_context_tokens": pa.uint32(),
}

# pyarrow: every file has exactly the documented columns and types.
for f in files:
    schema = pq.read_schema(f)
    assert schema.names == list(EXPECTED), (f, schema.names)
    for name, t in EXPECTED.items():
        assert schema.field(name).type == t, (f, name, schema.field(name).type, t)
    meta = schema.metadata or {}
    assert meta.get(b"polar.export_schema_version") == b"1", meta.keys()

# pyarrow dataset with Hive partitioning: `task` comes from the directories.
ds = pads.dataset(root, format="parquet", partitioning="hive")
table = ds.to_table()
assert "task" in table.column_names, table.column_names
for task, task_id in zip(table.column("task").to_pylist(), table.column("task_id").to_pylist()):
    assert task == task_id, (task, task_id)

# Hugging Face datasets, both entry points, offline.
import datasets

d1 = datasets.Dataset.from_parquet(files, cache_dir=cache)
d2 = datasets.load_dataset("parquet", data_files={"train": files}, split="train", cache_dir=cache)
assert d1.num_rows == d2.num_rows == table.num_rows, (d1.num_rows, d2.num_rows, table.num_rows)


def inner_dtype(feature):
    # datasets >= 4 has List(feature=...), older Sequence(feature=...).
    inner = getattr(feature, "feature", None)
    assert inner is not None, feature
    return inner.dtype


feats = d1.features
assert inner_dtype(feats["prompt_ids"]) == "uint32", feats["prompt_ids"]
assert inner_dtype(feats["response_ids"]) == "uint32", feats["response_ids"]
assert inner_dtype(feats["loss_mask"]) == "uint8", feats["loss_mask"]
assert inner_dtype(feats["response_logprobs"]) == "float32", feats["response_logprobs"]
assert inner_dtype(feats["labels"]) == "string", feats["labels"]
assert feats["reward"].dtype == "float64", feats["reward"]
assert feats["schema_version"].dtype == "uint32", feats["schema_version"]
assert feats["prompt_messages"].dtype == "string", feats["prompt_messages"]

rows = sorted(d2, key=lambda r: r["trace_id"])
for r in rows:
    assert len(r["loss_mask"]) == len(r["response_ids"]) == len(r["response_logprobs"])
    msgs = json.loads(r["prompt_messages"])
    assert msgs[0]["role"] == "system", msgs[0]
    json.loads(r["trace_metadata"])["spans"]

first = rows[0]
print(json.dumps({
    "rows": len(rows),
    "first_trace_id": first["trace_id"],
    "first_prompt_ids": first["prompt_ids"],
    "first_loss_tokens": sum(first["loss_mask"]),
    "first_reward": first["reward"],
    "labels": sorted({l for r in rows for l in r["labels"]}),
    "datasets_version": datasets.__version__,
    "pyarrow_version": pa.__version__,
}))
