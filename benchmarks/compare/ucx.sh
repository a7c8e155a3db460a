#!/usr/bin/env bash
# The ucx transport (a plugin) against the socket transport and against UCX's own ucx_perftest
# (ucp_get: latency at 8 B, bandwidth from 1 MiB), between two network-namespace hosts joined by
# a veth pair (UCX over TCP, as between two machines without RDMA), and on loopback. As root
# (namespaces); needs build/ with tutti-bench and build/plugins/libtutti-plugin-ucx.so, and
# ucx_perftest (Debian's ucx-utils; the set-up installs both).
#
#   benchmarks/compare/ucx.sh                 # 8 B to 1 GiB, both places
#   SIZES="8 1048576" WHERE=netns benchmarks/compare/ucx.sh
#
# Prints one table per place: per size the median get of each transport (us) and its bandwidth,
# ucx_perftest's figure for the same size, and the ratios ucx/perftest and socket/ucx.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bench=$root/build/bin/tutti-bench
plugins=$root/build/plugins
for need in "$bench" "$plugins/libtutti-plugin-ucx.so"; do
  [ -e "$need" ] || { echo "ucx.sh: $need is missing (scripts/build.sh builds it)" >&2; exit 2; }
done
command -v ucx_perftest >/dev/null || { echo "ucx.sh: no ucx_perftest (apt install ucx-utils)" >&2; exit 2; }
sizes=${SIZES:-"8 65536 1048576 16777216 268435456 1073741824"}
where=${WHERE:-"netns loopback"}
out=${OUT:-results/ucx}
mkdir -p "$out"
id=$$
ns_a=tutti-ua-$id ns_b=tutti-ub-$id
addr_a=10.232.9.1 addr_b=10.232.9.2
cleanup() { ip netns del "$ns_a" 2>/dev/null || true; ip netns del "$ns_b" 2>/dev/null || true; }
trap cleanup EXIT

make_hosts() {
  ip netns add "$ns_a" && ip netns add "$ns_b"
  ip link add "va$id" type veth peer name "vb$id"
  ip link set "va$id" netns "$ns_a" && ip link set "vb$id" netns "$ns_b"
  ip -n "$ns_a" addr add "$addr_a/24" dev "va$id" && ip -n "$ns_b" addr add "$addr_b/24" dev "vb$id"
  for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
  ip -n "$ns_a" link set "va$id" up && ip -n "$ns_b" link set "vb$id" up
}

# on_host <place> <a|b> cmd...: runs cmd on host a or b of the place (loopback: here).
on_host() {
  local place=$1 host=$2
  shift 2
  if [ "$place" = netns ]; then
    local ns=$ns_a
    [ "$host" = b ] && ns=$ns_b
    ip netns exec "$ns" "$@"
  else
    "$@"
  fi
}

# The get's median (us) for one transport and size, from rank 1's table.
tutti_get() {
  local place=$1 transport=$2 size=$3 port=$4 a=127.0.0.1 b=127.0.0.1
  [ "$place" = netns ] && a=$addr_a b=$addr_b
  local iters=50
  [ "$size" -ge 268435456 ] && iters=5
  local common=(env TUTTI_WORLD_SIZE=2 "TUTTI_STORE=tcp://$a:$port" TUTTI_JOB_ID=ucx-bench
                TUTTI_PLUGINS=ucx "TUTTI_PLUGIN_PATH=$plugins" UCX_TLS=tcp)
  on_host "$place" a "${common[@]}" TUTTI_RANK=0 TUTTI_HOST_ID=host-a "TUTTI_GLOO_HOSTNAME=$a" \
    "$bench" --op transfer --transport "$transport" -b "$size" -e "$size" -w 3 -n "$iters" \
    >/dev/null 2>&1 &
  local owner=$!
  on_host "$place" b "${common[@]}" TUTTI_RANK=1 TUTTI_HOST_ID=host-b "TUTTI_GLOO_HOSTNAME=$b" \
    "$bench" --op transfer --transport "$transport" -b "$size" -e "$size" -w 3 -n "$iters" \
    >"$out/$place-$transport-$size.txt" 2>&1 || true
  wait "$owner" || true
  # The data row: size first, the get's median third (cold, get, ...).
  awk -v s="$size" '$1 == s {print $3; exit}' "$out/$place-$transport-$size.txt"
}

# ucx_perftest's ucp_get: average latency (us) at this size.
perftest() {
  local place=$1 size=$2 port=$3 a=127.0.0.1
  [ "$place" = netns ] && a=$addr_a
  local iters=1000
  [ "$size" -ge 16777216 ] && iters=20
  on_host "$place" a env UCX_TLS=tcp ucx_perftest -p "$port" -t ucp_get -s "$size" -n "$iters" \
    >/dev/null 2>&1 &
  local server=$!
  sleep 0.5
  on_host "$place" b env UCX_TLS=tcp ucx_perftest -p "$port" "$a" -t ucp_get -s "$size" -n "$iters" \
    >"$out/$place-perftest-$size.txt" 2>&1 || true
  wait "$server" || true
  # "Final:  iters  typical  avg  overall  bw-avg  bw-overall  msgrate..."
  awk '/Final:/ {print $4; exit}' "$out/$place-perftest-$size.txt"
}

human() {
  local n=$1
  if [ "$n" -ge 1073741824 ]; then echo "$((n >> 30)) GiB"
  elif [ "$n" -ge 1048576 ]; then echo "$((n >> 20)) MiB"
  elif [ "$n" -ge 1024 ]; then echo "$((n >> 10)) KiB"
  else echo "$n B"; fi
}

port=29721
for place in $where; do
  [ "$place" = netns ] && make_hosts
  echo "### $place: a get (us, median), rank 0 owns, rank 1 gets"
  echo
  echo "| size | ucx | socket | ucx_perftest ucp_get | ucx / perftest | socket / ucx | ucx GB/s |"
  echo "|---:|---:|---:|---:|---:|---:|---:|"
  for size in $sizes; do
    u=$(tutti_get "$place" ucx "$size" $((port++)))
    s=$(tutti_get "$place" socket "$size" $((port++)))
    p=$(perftest "$place" "$size" $((port++)))
    awk -v n="$(human "$size")" -v u="${u:-nan}" -v s="${s:-nan}" -v p="${p:-nan}" -v b="$size" \
      'BEGIN { printf "| %s | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f |\n", n, u, s, p, u / p, s / u, b / u / 1000 }'
  done
  grep -h "put of 1000 views" "$out/$place-ucx-"*.txt 2>/dev/null | head -1
  echo
  [ "$place" = netns ] && cleanup
done
