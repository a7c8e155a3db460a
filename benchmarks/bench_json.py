"""Reading tutti-bench JSON (and the comparison tools' JSON, which has the same shape)."""
import json


def load_run(path):
    """Returns (config, label, rows): one placement per run (out-of-place where the op has it,
    else in-place) and the run's label ("tutti shm", "openmpi", ...)."""
    with open(path) as f:
        doc = json.load(f)
    config, rows = doc["config"], doc["rows"]
    placements = {r["in_place"] for r in rows}
    chosen = False if False in placements else True
    rows = [r for r in rows if r["in_place"] == chosen]
    label = ("tutti " if config.get("tool") == "tutti-bench" else "") + str(config.get("backend", "?"))
    return config, label, rows
