#!/usr/bin/env python3
"""Checks a tutti-bench JSON and CSV pair: every column present, values consistent.

usage: check_bench_json.py FILE.json FILE.csv OP baseline|plain|async
"""
import csv
import json
import sys

path, csv_path, op, mode = sys.argv[1:5]
doc = json.load(open(path))
config, rows = doc["config"], doc["rows"]
for key in ("tool", "version", "op", "backend", "world_size", "hosts", "dtype", "redop", "root",
            "warmup", "iters", "check", "baseline", "bus_factor"):
    assert key in config, f"config lacks {key}"
assert config["op"] == op, config
assert config["world_size"] == 2, config
assert rows, "no rows"
columns = ["op", "size_bytes", "count", "dtype", "redop", "root", "in_place", "time_us", "p99_us",
           "mean_us", "algbw_gbps", "busbw_gbps", "wrong"]
if mode == "baseline":
    columns += ["baseline_time_us", "ratio"]
json_only = []
if mode == "async":
    assert config["async"] is True, config
    json_only = ["compute_us", "overlapped_us", "hidden"]
for row in rows:
    for key in json_only:
        assert key in row, f"row lacks {key}: {row}"
    if mode == "async":
        assert row["compute_us"] > 0 and row["overlapped_us"] > 0, row
        want = (row["time_us"] + row["compute_us"] - row["overlapped_us"]) / row["time_us"]
        assert abs(row["hidden"] - min(1.0, max(0.0, want))) < 1e-6, row
    for key in columns:
        assert key in row, f"row lacks {key}: {row}"
    assert row["op"] == op
    assert row["wrong"] == 0, row
    assert row["time_us"] > 0 and row["p99_us"] >= row["time_us"], row
    assert row["mean_us"] > 0, row
    if op != "barrier":
        assert abs(row["algbw_gbps"] - row["size_bytes"] / row["time_us"] / 1e3) < 1e-6 * max(1, row["algbw_gbps"]), row
        assert abs(row["busbw_gbps"] - row["algbw_gbps"] * config["bus_factor"]) < 1e-9 + 1e-6 * row["busbw_gbps"], row
    if mode == "baseline":
        assert row["baseline_time_us"] > 0, row
        assert abs(row["ratio"] - row["time_us"] / row["baseline_time_us"]) < 1e-6 * row["ratio"] + 1e-9, row
with open(csv_path) as f:
    table = list(csv.DictReader(f))
assert len(table) == len(rows), (len(table), len(rows))
for key in columns:
    assert key in table[0], f"csv lacks {key}"
print(f"{op}: {len(rows)} rows OK")
