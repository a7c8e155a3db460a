"""The README's Python, Ray and torch snippets, run as written, so they cannot go stale.

Each fenced block right after a "<!-- run by python/tests/test_readme.py, as written -->" line:
a ``sh`` block runs with bash from the repository's top level (where its build/venv paths are
meant), a ``python`` block with this interpreter. A block must exit 0 within its time, and what it
prints is checked where the README says what it prints.
"""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARK = "<!-- run by python/tests/test_readme.py, as written -->"


def snippets():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    found = []
    for m in re.finditer(re.escape(MARK) + r"\n```(\w+)\n(.*?)\n```", text, re.S):
        line = text[:m.start()].count("\n") + 1
        found.append(pytest.param(m.group(1), m.group(2), id=f"README.md:{line}"))
    return found


def test_every_marked_block_is_found():
    with open(os.path.join(ROOT, "README.md")) as f:
        marks = f.read().count(MARK)
    assert marks == len(snippets()) and marks >= 4, marks


@pytest.mark.parametrize("lang,code", snippets())
def test_readme_snippet(lang, code, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if lang == "sh":
        cmd = ["bash", "-euo", "pipefail", "-c", code]
    else:
        assert lang == "python", lang
        cmd = [sys.executable, "-c", code]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    out = done.stdout
    # Where the README says what a block prints, it must.
    if "hello.py" in code:
        assert "rank 0/2: [3. 3. 3. 3.]" in out and "rank 1/2: [3. 3. 3. 3.]" in out, out
    if "symmetric.py" in code:
        assert "rank 0: [3. 3. 3.] ... 3.0" in out and "rank 1: [3. 3. 3.] ... 3.0" in out, out
    if "train.py" in code:
        assert "rank 0: [3.0, 3.0, 3.0, 3.0]" in out and "rank 1: [3.0, 3.0, 3.0, 3.0]" in out, out
    if "tensor_transport" in code:
        assert "1048576.0" in out and "freed" in out, out
    if "create_collective_group" in code:
        assert "20." in out and "3." in out, out
