"""NIXL's one-sided READ of a CPU buffer, for the comparison with the ucx transport (issue 24;
benchmarks/compare/nixl.sh runs it between two network-namespace hosts).

Not part of the project's environment: NIXL comes from PyPI's nixl-cu13 in a venv of its own
(it pulls CUDA's Python packages; several GB). Usage:
    python nixl_read.py owner|consumer <exchange dir> <size,size,...>
The owner registers one buffer per size and writes its agent's metadata and descriptors into the
directory; the consumer reads each buffer with READ transfers and prints the median of its warm
reads (initialize, transfer, poll until done), checking the bytes.
"""
import os
import statistics
import sys
import time

import numpy as np
from nixl_cu13._api import nixl_agent, nixl_agent_config

role, exchange = sys.argv[1], sys.argv[2]
sizes = [int(x) for x in sys.argv[3].split(",")]
agent = nixl_agent(role, nixl_agent_config(backends=["UCX"]))
buffers = {s: np.full(s, 7 if role == "owner" else 0, dtype=np.uint8) for s in sizes}


def reg_descs(a):
    return agent.get_reg_descs([(a.ctypes.data, a.nbytes, 0, "")], "DRAM")


def xfer_descs(a):
    return agent.get_xfer_descs([(a.ctypes.data, a.nbytes, 0)], "DRAM")


registrations = [agent.register_memory(reg_descs(buffers[s])) for s in sizes]


def wait_for(path):
    deadline = time.monotonic() + 120
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"nixl_read: {path} never appeared")
        time.sleep(0.01)


if role == "owner":
    for s in sizes:
        with open(os.path.join(exchange, f"descs{s}"), "wb") as f:
            f.write(agent.get_serialized_descs(xfer_descs(buffers[s])))
    with open(os.path.join(exchange, "meta.tmp"), "wb") as f:
        f.write(agent.get_agent_metadata())
    os.rename(os.path.join(exchange, "meta.tmp"), os.path.join(exchange, "meta"))
    wait_for(os.path.join(exchange, "done"))
else:
    wait_for(os.path.join(exchange, "meta"))
    with open(os.path.join(exchange, "meta"), "rb") as f:
        owner = agent.add_remote_agent(f.read())
    for s in sizes:
        with open(os.path.join(exchange, f"descs{s}"), "rb") as f:
            remote = agent.deserialize_descs(f.read())
        local = xfer_descs(buffers[s])
        reps = 50 if s <= (16 << 20) else 5
        times = []
        for i in range(reps + 3):
            buffers[s][:] = 0
            start = time.perf_counter()
            handle = agent.initialize_xfer("READ", local, remote, owner)
            state = agent.transfer(handle)
            while state != "DONE":
                state = agent.check_xfer_state(handle)
                if state == "ERR":
                    raise SystemExit(f"nixl_read: the READ of {s} B failed")
            elapsed = time.perf_counter() - start
            agent.release_xfer_handle(handle)
            if i >= 3:  # warm-up
                times.append(elapsed * 1e6)
        if buffers[s][0] != 7 or buffers[s][-1] != 7:
            raise SystemExit(f"nixl_read: wrong bytes after the READ of {s} B")
        print(f"nixl READ {s} B: median {statistics.median(times):.1f} us", flush=True)
    open(os.path.join(exchange, "done"), "w").close()
# nixl-cu13 1.5.1 crashed (SIGSEGV) in its teardown at interpreter exit here, after the figures:
# leave without it.
sys.stdout.flush()
os._exit(0)
