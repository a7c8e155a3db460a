#!/usr/bin/env bash
# scripts/device/run.sh's own logic, checked here against the stand-in CUDA runtime and NCCL:
# a bundle laid out as prepare.sh makes it (this build's binaries; lib/ holding the stand-in's
# libcudart.so.13 where the device bundle holds the real one), a fake nvidia-nccl-cu13 wheel
# (nvidia/nccl/lib/libnccl.so.2 on PYTHONPATH) and a fake nvidia-smi.
#   1. Everything there: exit 0, at most 8 files in $OUT, result.json passed with every step.
#   2. No wheel: exit 3 at once, saying so.
#   3. No GPU (TUTTI_STANDIN_DEVICES=0): the GPU tests skip, and that is a failure (exit 1).
#   4. python.sh with a Python that cannot build the modules: exit 3, saying why.
#   5. ab-nccl.sh: a table and ab-nccl.json from two library directories; exit 2, saying why,
#      for a directory without the backend.
#
#   device_run_test.sh REPO BUILD_DIR STANDIN_LIB_DIR BINARY...
set -uo pipefail
repo=$1
build=$2
standin=$3
shift 3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "device_run_test: FAILED: $*" >&2
  exit 1
}

mkdir -p "$tmp/bundle/bin" "$tmp/bundle/lib" "$tmp/site/nvidia/nccl/lib" "$tmp/fakebin"
for b in "$@"; do ln -s "$b" "$tmp/bundle/bin/"; done
# tutti's libraries, as prepare.sh copies them (the binaries find them on LD_LIBRARY_PATH).
for l in "$build"/src/libtutti.so* "$build"/backends/*/libtutti_*.so*; do ln -s "$l" "$tmp/bundle/lib/"; done
ln -s "$standin/libcudart.so.13" "$tmp/bundle/lib/libcudart.so.13"
cp "$standin/libnccl.so.2" "$tmp/site/nvidia/nccl/lib/libnccl.so.2"
cat >"$tmp/fakebin/nvidia-smi" <<'EOF'
#!/bin/sh
echo "Stand-in GPU, 580.00.00, Default, 1024 MiB"
EOF
chmod +x "$tmp/fakebin/nvidia-smi"

run() {  # run OUT_DIR [VAR=value...]: run.sh with the fake layout; prints its exit status
  local out=$1
  shift
  mkdir -p "$out"
  env OUT="$out" PATH="$tmp/fakebin:$PATH" PYTHONPATH="$tmp/site" \
    TUTTI_DEVICE_BUNDLE="$tmp/bundle" TUTTI_DEVICE_BENCH_MAX=64K TUTTI_DEVICE_IPC_MIN=4K \
    TUTTI_DEVICE_IPC_MAX=64K TUTTI_DEVICE_PYTHON_TESTS=0 LD_LIBRARY_PATH= "$@" \
    bash "$repo/scripts/device/run.sh" >"$out.stdout" 2>&1
  echo $?
}

# 1. Everything there.
rc=$(run "$tmp/ok")
cat "$tmp/ok.stdout"
[ "$rc" = 0 ] || fail "run.sh exited $rc with everything in place"
files=$(find "$tmp/ok" -type f | wc -l)
[ "$files" -le 8 ] || fail "$files files in \$OUT (at most 8 come back)"
for f in run.log result.json bench-nccl.json bench-cuda-ipc.json; do
  [ -s "$tmp/ok/$f" ] || fail "no $f in \$OUT"
done
python3 - "$tmp/ok/result.json" <<'EOF' || fail "result.json is not what it should be"
import json, sys
r = json.load(open(sys.argv[1]))
names = [s["name"] for s in r["steps"]]
want = ["libraries", "nccl_test", "nccl_gpu_test", "nccl_world_test", "bench_nccl",
        "gpu_allreduce", "multigpu_allreduce", "cuda_ipc_test", "bench_cuda_ipc",
        "bench_cuda_ipc_borrow"]
assert r["status"] == "passed", r
assert names == want, names
assert all(s["passed"] and s["seconds"] <= s["limit_seconds"] for s in r["steps"]), r["steps"]
assert sum(s["limit_seconds"] for s in r["steps"]) <= 360, "limits add up past 6 minutes"
assert r["nccl_library"].endswith("nvidia/nccl/lib/libnccl.so.2"), r["nccl_library"]
assert "Stand-in GPU" in r["device"], r["device"]
EOF
grep -q "NCCL_DEBUG\|nccl: .*libnccl.so.2" "$tmp/ok/run.log" || fail "run.log does not name NCCL"
python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$tmp/ok/bench-nccl.json" ||
  fail "bench-nccl.json is not JSON"

# 2. No wheel: stops at once with 3.
rc=$(run "$tmp/nowheel" PYTHONPATH="$tmp/nowhere")
[ "$rc" = 3 ] || { cat "$tmp/nowheel.stdout"; fail "run.sh exited $rc without NCCL (want 3)"; }
grep -q "no libnccl.so.2 from the nvidia-nccl-cu13 wheel" "$tmp/nowheel.stdout" ||
  fail "no clear message without NCCL: $(cat "$tmp/nowheel.stdout")"
grep -q '"status": "no_nccl"' "$tmp/nowheel/result.json" || fail "result.json without NCCL"

# 3. No GPU: the GPU tests skip, which fails the run, naming the step.
rc=$(run "$tmp/nogpu" TUTTI_STANDIN_DEVICES=0)
[ "$rc" = 1 ] || { cat "$tmp/nogpu.stdout"; fail "run.sh exited $rc with every GPU test skipped"; }
grep -q "FAILED nccl_gpu_test.*a test skipped" "$tmp/nogpu.stdout" ||
  fail "the skipped GPU tests are not named: $(cat "$tmp/nogpu.stdout")"
# 4. python.sh (run.sh's python_gpu step) where the Python cannot build the modules: exit 3 at
# once, saying what is missing.
mkdir -p "$tmp/fakepy"
printf '#!/bin/sh\nexit 1\n' > "$tmp/fakepy/python3"
chmod +x "$tmp/fakepy/python3"
TUTTI_DEVICE_BUNDLE="$tmp/bundle" TUTTI_DEVICE_PYTHON="$tmp/fakepy/python3" \
  bash "$repo/scripts/device/python.sh" "$tmp/pywork" >"$tmp/py.stdout" 2>&1
rc=$?
[ "$rc" = 3 ] || { cat "$tmp/py.stdout"; fail "python.sh exited $rc without nanobind (want 3)"; }
grep -q "has no nanobind" "$tmp/py.stdout" || fail "python.sh does not say why: $(cat "$tmp/py.stdout")"
# 5. ab-nccl.sh (the NCCL backend's A/B there): two library directories, alternated; a table
# with B/A per size and ab-nccl.json. The same build on both sides here.
mkdir -p "$tmp/ab/a" "$tmp/ab/b" "$tmp/about"
for side in a b; do ln -s "$build/backends/nccl/libtutti_nccl.so.0" "$tmp/ab/$side/"; done
env OUT="$tmp/about" PYTHONPATH="$tmp/site" TUTTI_DEVICE_BUNDLE="$tmp/bundle" PAIRS=2 \
  BENCH_ARGS="-b 8 -e 32 -f 4 -w 2 -n 5" LD_LIBRARY_PATH= \
  bash "$repo/scripts/device/ab-nccl.sh" "$tmp/ab/a" "$tmp/ab/b" >"$tmp/ab.stdout" 2>&1 ||
  { cat "$tmp/ab.stdout"; fail "ab-nccl.sh failed"; }
grep -q "B/A" "$tmp/ab.stdout" || fail "ab-nccl.sh printed no table: $(cat "$tmp/ab.stdout")"
python3 - "$tmp/about/ab-nccl.json" <<'EOF' || fail "ab-nccl.json is not what it should be"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["pairs"] == 2, r
assert [row["size_bytes"] for row in r["rows"]] == [8, 32], r["rows"]
assert all(row["a_us"] > 0 and row["b_us"] > 0 and row["raw_us"] > 0 for row in r["rows"]), r
EOF
env PYTHONPATH="$tmp/site" bash "$repo/scripts/device/ab-nccl.sh" "$tmp/ab/a" "$tmp/nowhere" \
  >"$tmp/ab2.stdout" 2>&1
rc=$?
[ "$rc" = 2 ] || fail "ab-nccl.sh exited $rc for a directory without the library (want 2)"
grep -q "has no libtutti_nccl.so.0" "$tmp/ab2.stdout" || fail "ab-nccl.sh does not say why"
echo "device_run_test: OK"
