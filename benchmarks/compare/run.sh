#!/usr/bin/env bash
# tutti (shm and Gloo backends), raw Gloo, Open MPI and PyTorch's torch.distributed gloo: the
# same allreduce sweep in one run, one table (Markdown) and one plot.
#
#   benchmarks/compare/run.sh                  # 2 ranks, 8 B to 64 MiB
#   RANKS=4 MAX=16M benchmarks/compare/run.sh
#
# Installs what it needs from Debian (python3-torch, python3-matplotlib, openmpi-bin) first.
set -euo pipefail
cd "$(dirname "$0")/../.."
ranks=${RANKS:-2}
max=${MAX:-64M}
iters=${ITERS:-50}
out=${OUT:-results/compare}

scripts/build.sh >&2
need=()
for p in python3-torch python3-matplotlib openmpi-bin libopenmpi-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
mkdir -p "$out"
# Debian's interpreter: python3-torch and python3-matplotlib are installed for it (a python3
# earlier on PATH, such as a pyenv one, would not see them).
py=${PYTHON:-/usr/bin/python3}
mpicxx -O2 -o build/mpi_allreduce benchmarks/compare/mpi_allreduce.cc

common=(-b 8 -e "$max" -f 2 -w 10 -n "$iters")
# shm runs on its own: interleaved with raw Gloo, Gloo's event-loop threads compete for the
# cores it spins on. Raw Gloo is interleaved with tutti's Gloo backend, its like for like.
echo "== tutti (shm)" >&2
build/bin/tutti-bench --ranks "$ranks" --backend shm "${common[@]}" --json "$out/tutti-shm.json"
echo "== tutti (gloo) with raw Gloo interleaved" >&2
build/bin/tutti-bench --ranks "$ranks" --backend gloo "${common[@]}" --baseline --json "$out/tutti-gloo.json"
echo "== Open MPI" >&2
mpi_root=(); [ "$(id -u)" -eq 0 ] && mpi_root=(--allow-run-as-root)
mpirun "${mpi_root[@]}" --oversubscribe -np "$ranks" build/mpi_allreduce "${common[@]}" --json "$out/openmpi.json"
echo "== PyTorch torch.distributed (gloo)" >&2
"$py" benchmarks/compare/torch_allreduce.py --ranks "$ranks" "${common[@]}" --json "$out/torch.json"

runs=("$out/tutti-shm.json" "$out/tutti-gloo.json" "$out/openmpi.json" "$out/torch.json")
"$py" benchmarks/compare/table.py "${runs[@]}" | tee "$out/table.md"
"$py" benchmarks/plot.py "${runs[@]}" -o "$out/allreduce.png" \
  --title "allreduce, $ranks ranks, float32 sum: tutti shm and gloo, raw Gloo, Open MPI, PyTorch"
