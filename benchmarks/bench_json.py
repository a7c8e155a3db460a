"""Reading tutti-bench JSON (and the comparison tools' JSON, which has the same shape)."""
import json


def load_run(path):
    """Returns (config, label, rows): one placement per run (out-of-place where the op has it,
    else in-place) and the run's label ("tutti shm", "openmpi", ...)."""
    with open(path) as f:
        doc = json.load(f)
    config, rows = doc["config"], doc["rows"]
    # Rows without a placement (the direct transport's) are taken as they are.
    placements = {r.get("in_place", False) for r in rows}
    chosen = False if False in placements else True
    rows = [r for r in rows if r.get("in_place", False) == chosen]
    label = ("tutti " if config.get("tool") == "tutti-bench" else "") + str(config.get("backend", "?"))
    if config.get("symmetric"):
        label += ", symmetric memory"
    return config, label, rows


def merge_runs(paths):
    """Several runs of one implementation (the same sweep repeated) as one: (config, label,
    rows), each row the median run's at its size, with "min_us" and "max_us" (the spread of the
    runs' medians), "runs" (how many) and "time_us" the median of the runs' medians (busbw and
    algbw follow it)."""
    import statistics
    loaded = [load_run(p) for p in paths]
    if not loaded:
        raise ValueError("no runs to merge")
    config, label, _ = loaded[0]
    by_size = {}
    for _, _, rows in loaded:
        for r in rows:
            by_size.setdefault(r["size_bytes"], []).append(r)
    merged = []
    for size in sorted(by_size):
        rows = by_size[size]
        times = [r["time_us"] for r in rows]
        median = statistics.median(times)
        row = dict(min(rows, key=lambda r: abs(r["time_us"] - median)))
        scale = row["time_us"] / median if median > 0 else 1.0
        row["time_us"] = median
        for key in ("algbw_gbps", "busbw_gbps"):
            if key in row:
                row[key] = row[key] * scale
        if "baseline_time_us" in row:
            row["baseline_time_us"] = statistics.median(r["baseline_time_us"] for r in rows)
        row["min_us"], row["max_us"], row["runs"] = min(times), max(times), len(times)
        merged.append(row)
    return config, label, merged


def write_run(path, config, rows):
    with open(path, "w") as f:
        json.dump({"config": config, "rows": rows}, f, indent=1)
