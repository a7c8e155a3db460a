#!/usr/bin/env bash
# tutti (shm, gloo, auto), raw Gloo and Open MPI (TCP and shared memory): the same float32 sum
# allreduce sweep, side by side, with repetitions, on loopback and between two network-namespace
# "hosts" joined by a veth pair; one table at the end (medians over the repetitions).
#
#   benchmarks/compare/run.sh                         # every configuration, 3 repetitions
#   CONFIGS="lo2 ns1+1" REPS=5 benchmarks/compare/run.sh
#   STEP=lo4:2 benchmarks/compare/run.sh              # one configuration, one repetition (see
#                                                     # below), then TABLE=1 for the table
#
# Configurations: lo2, lo4 (2 or 4 ranks on this host), lo2hog, lo4hog (the same beside a
# CPU-bound process, `yes`, started for the configuration and stopped after it: a busy host),
# lo2hog2, lo4hog2 (beside two of them: both CPUs busy besides the ranks; not in the default set),
# lo2build, lo4build (beside a build: two compilers at once, g++ -O2 of one of tutti's sources
# again and again, which also use the memory and the caches as a hog does not; not in the
# default set, as a configuration takes several minutes there),
# ns1+1 and ns2+2 (1 or 2 ranks in each of two namespaces; needs root). Each repetition of a configuration runs every implementation
# once, one after another:
#   tutti shm          tutti-bench --backend shm (one host only)
#   tutti auto         the default: shm on one host; across hosts gloo
#   tutti gloo         tutti-bench --backend gloo
#   raw gloo           the baseline column of a second gloo run with raw Gloo interleaved in the
#                      same processes (--baseline); that run's own tutti column is not shown: raw
#                      Gloo's event-loop threads share the cores with it (at 4 ranks on 2 cores
#                      they cost tutti up to 1.2x at some small sizes)
#   tutti gloo, Gloo's functions   the same with TUTTI_GLOO_ALLREDUCE=gloo: Gloo's own allreduce
#                      instead of tutti's over the same connections
#                      (backends/gloo/gloo_direct_exchange.h), for before/after
#   openmpi tcp        mpirun --mca btl self,tcp
#   openmpi sm         mpirun --mca btl self,vader (one host only)
# Between namespaces, tutti's ranks are started by hand in each namespace (TUTTI_RANK...,
# TUTTI_HOST_ID naming the namespace, so "auto" sees two hosts) and Open MPI's through mpirun run
# inside the first namespace with a launch agent (plm_rsh_agent) that enters the namespace named
# as the host; there Open MPI yields when idle (mpi_yield_when_idle), without which it measured
# 8 ms per call on this VM's veth (a busy-polling receiver starves the softirq that delivers
# its packets until the next timer tick).
#
# Output: results/compare/<config>/<implementation>.r<rep>.json and the table in
# results/compare/table.md. Installs Open MPI from Debian if missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
configs=${CONFIGS:-lo2 lo4 lo2hog lo4hog ns1+1 ns2+2}
reps=${REPS:-3}
sweep=(-b "${MIN:-8}" -e "${MAX:-64M}" -f "${FACTOR:-2}" -w "${WARMUP:-5}" -n "${ITERS:-20}")
out=${OUT:-results/compare}
py=/usr/bin/python3
[ -x "$py" ] || py=python3

prepare() {
  scripts/build.sh >&2
  if ! command -v mpicxx >/dev/null || ! command -v mpirun >/dev/null; then
    sudo=""; [ "$(id -u)" -ne 0 ] && sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
      openmpi-bin libopenmpi-dev >/dev/null
  fi
  mpicxx -O2 -o build/mpi_allreduce benchmarks/compare/mpi_allreduce.cc
}

as_root=(); [ "$(id -u)" -eq 0 ] && as_root=(--allow-run-as-root)

# ---- two namespace "hosts" -------------------------------------------------------------------
ns_a=tutti-cmp-a; ns_b=tutti-cmp-b
addr_a=10.231.9.1; addr_b=10.231.9.2  # inside the namespaces made here; nothing leaves them
agent=""
make_hosts() {
  [ "$(id -u)" -eq 0 ] || { echo "compare: namespaces need root" >&2; return 1; }
  drop_hosts
  ip netns add $ns_a && ip netns add $ns_b
  ip link add tcmpa type veth peer name tcmpb
  ip link set tcmpa netns $ns_a && ip link set tcmpb netns $ns_b
  ip -n $ns_a addr add $addr_a/24 dev tcmpa && ip -n $ns_b addr add $addr_b/24 dev tcmpb
  for n in $ns_a $ns_b; do ip -n $n link set lo up; done
  ip -n $ns_a link set tcmpa up && ip -n $ns_b link set tcmpb up
  agent=$(mktemp /tmp/tutti-cmp-agent.XXXXXX)
  # mpirun calls it as: agent [options] HOST COMMAND...; the host is a namespace's name.
  cat >"$agent" <<'EOF'
#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
host=$1; shift
exec ip netns exec "$host" sh -c "$*"
EOF
  chmod +x "$agent"
}
drop_hosts() {
  ip netns del $ns_a 2>/dev/null || true  # takes its end of the veth pair with it
  ip netns del $ns_b 2>/dev/null || true
  [ -n "$agent" ] && rm -f "$agent"
  agent=""
}

# tutti-bench as `per` ranks in each namespace; rank 0 (in the first) writes the JSON.
tutti_ns() {
  local per=$1 json=$2; shift 2
  local world=$((2 * per)) port=$((29000 + RANDOM % 1000)) pids=() r ns addr
  for ((r = world - 1; r >= 0; r--)); do
    if ((r < per)); then ns=$ns_a; addr=$addr_a; else ns=$ns_b; addr=$addr_b; fi
    local args=("$@")
    ((r == 0)) && args+=(--json "$json")
    ip netns exec $ns env TUTTI_RANK=$r TUTTI_WORLD_SIZE=$world TUTTI_LOCAL_RANK=$((r % per)) \
      TUTTI_LOCAL_WORLD_SIZE=$per TUTTI_STORE=tcp://$addr_a:$port TUTTI_JOB_ID=cmp-$port \
      TUTTI_GLOO_HOSTNAME=$addr TUTTI_HOST_ID=$ns ${EXTRA_ENV:-} \
      build/bin/tutti-bench "${args[@]}" >"$json.rank$r.log" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  [ $rc -eq 0 ] && rm -f "$json".rank*.log
  return $rc
}

# The busy configurations' pair: tutti shm and Open MPI's shared memory at $1 ranks, one run
# each, into $2 as repetition $3 (with step()'s `common` options).
shm_and_mpi_sm() {
  local n=$1 dir=$2 rep=$3
  build/bin/tutti-bench --ranks "$n" --backend shm "${common[@]}" --json "$dir/shm.r$rep.json" >&2
  mpirun "${as_root[@]}" --oversubscribe --mca btl self,vader -np "$n" build/mpi_allreduce \
    "${sweep[@]}" --label "openmpi sm" --json "$dir/mpi-sm.r$rep.json" >&2
}

# One repetition of one configuration: every implementation once.
step() {
  local config=$1 rep=$2 dir="$out/$1"
  mkdir -p "$dir"
  local common=(--op allreduce "${sweep[@]}" -d float32 -o sum -c 1)
  echo "== $config, repetition $rep" >&2
  local hog=""
  case $config in
    lo2hog|lo4hog|lo2hog2|lo4hog2)
      # tutti's shm and Open MPI's shared memory beside a CPU hog, or two (the Gloo paths are
      # measured quiet; beside a hog they only repeat what the quiet rows say about TCP).
      local n=${config:2:1} k
      local hogs=1
      [[ $config == *hog2 ]] && hogs=2
      for ((k = 0; k < hogs; k++)); do
        yes >/dev/null &
        hog="$hog $!"
      done
      trap 'kill $hog 2>/dev/null || true' EXIT
      shm_and_mpi_sm "$n" "$dir" "$rep"
      # shellcheck disable=SC2086  # the hogs' pids, one word each
      kill $hog 2>/dev/null || true
      wait $hog 2>/dev/null || true
      trap - EXIT
      ;;
    lo2build|lo4build)
      local n=${config:2:1}
      # A 2-job build's load, in a process group of its own (setsid) stopped as a whole.
      rm -f "$dir/load.pgid"
      setsid bash -c 'echo $$ > "$0"; while :; do c++ -std=c++17 -O2 -DASIO_STANDALONE -DFMT_SHARED \
        -DSPDLOG_COMPILED_LIB -DSPDLOG_FMT_EXTERNAL -DSPDLOG_SHARED_LIB -Iinclude -Isrc \
        -c src/group/collective_group.cc -o /dev/null & wait; done &
        while :; do c++ -std=c++17 -O2 -Iinclude -Isrc -c backends/shm/shm_collectives.cc \
        -o /dev/null & wait; done & wait' "$dir/load.pgid" >/dev/null 2>&1 &
      # Its group's id as the load itself wrote it: setsid forks where the caller made it a
      # group's leader (job control), and $! is then not the group.
      local tries=0
      until [ -s "$dir/load.pgid" ]; do
        ((++tries <= 100)) || { echo "compare: the build load did not start" >&2; return 1; }
        sleep 0.1
      done
      hog=$(cat "$dir/load.pgid")
      trap 'kill -- -$hog 2>/dev/null || true' EXIT
      sleep 2  # the compilers under way
      shm_and_mpi_sm "$n" "$dir" "$rep"
      kill -- -"$hog" 2>/dev/null || true
      wait 2>/dev/null || true
      rm -f "$dir/load.pgid"
      trap - EXIT
      ;;
    lo2|lo4)
      local n=${config#lo}
      build/bin/tutti-bench --ranks "$n" --backend shm "${common[@]}" --json "$dir/shm.r$rep.json" >&2
      build/bin/tutti-bench --ranks "$n" --backend auto "${common[@]}" --json "$dir/auto.r$rep.json" >&2
      build/bin/tutti-bench --ranks "$n" --backend gloo "${common[@]}" --json "$dir/gloo.r$rep.json" >&2
      build/bin/tutti-bench --ranks "$n" --backend gloo "${common[@]}" --baseline \
        --json "$dir/gloo-and-raw.r$rep.json" >&2
      TUTTI_GLOO_ALLREDUCE=gloo build/bin/tutti-bench --ranks "$n" --backend gloo "${common[@]}" \
        --json "$dir/gloo-functions.r$rep.json" >&2
      mpirun "${as_root[@]}" --oversubscribe --mca btl self,tcp -np "$n" build/mpi_allreduce \
        "${sweep[@]}" --label "openmpi tcp" --json "$dir/mpi-tcp.r$rep.json" >&2
      mpirun "${as_root[@]}" --oversubscribe --mca btl self,vader -np "$n" build/mpi_allreduce \
        "${sweep[@]}" --label "openmpi sm" --json "$dir/mpi-sm.r$rep.json" >&2
      ;;
    ns1+1|ns2+2)
      local per=${config:2:1}
      make_hosts
      trap drop_hosts EXIT
      tutti_ns "$per" "$dir/auto.r$rep.json" --backend auto "${common[@]}"
      tutti_ns "$per" "$dir/gloo.r$rep.json" --backend gloo "${common[@]}"
      tutti_ns "$per" "$dir/gloo-and-raw.r$rep.json" --backend gloo "${common[@]}" --baseline
      EXTRA_ENV=TUTTI_GLOO_ALLREDUCE=gloo tutti_ns "$per" "$dir/gloo-functions.r$rep.json" \
        --backend gloo "${common[@]}"
      # Open MPI's launch into the second namespace fails now and then ("ORTE does not know how
      # to route a message to the specified daemon"): up to 3 tries.
      local try
      for try in 1 2 3; do
        ip netns exec $ns_a mpirun "${as_root[@]}" --oversubscribe --host "$ns_a:$per,$ns_b:$per" \
          -np $((2 * per)) --mca plm_rsh_agent "$agent" --mca btl self,tcp \
          --mca btl_tcp_if_include 10.231.9.0/24 --mca oob_tcp_if_include 10.231.9.0/24 \
          --mca mpi_yield_when_idle 1 build/mpi_allreduce "${sweep[@]}" --label "openmpi tcp" \
          --json "$dir/mpi-tcp.r$rep.json" >&2 && break
        [ "$try" -lt 3 ] || return 1
        echo "compare: Open MPI's launch failed, trying again" >&2
      done
      drop_hosts
      trap - EXIT
      ;;
    *) echo "compare: unknown configuration '$config'" >&2; return 1 ;;
  esac
}

if [ -n "${STEP:-}" ]; then
  step "${STEP%%:*}" "${STEP##*:}"
elif [ -z "${TABLE:-}" ]; then
  prepare
  for ((rep = 1; rep <= reps; rep++)); do
    for config in $configs; do step "$config" "$rep"; done
  done
fi
"$py" benchmarks/compare/table.py "$out" | tee "$out/table.md"
