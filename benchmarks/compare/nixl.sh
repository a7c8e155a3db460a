#!/usr/bin/env bash
# NIXL's READ (benchmarks/compare/nixl_read.py) between two network-namespace hosts joined by a
# veth pair, UCX over TCP, beside benchmarks/compare/ucx.sh's figures for the ucx transport. As
# root. NIXL is not one of the project's dependencies: give a Python that has it,
#   python3 -m venv /tmp/nixl && /tmp/nixl/bin/pip install nixl-cu13==1.5.1
#   NIXL_PYTHON=/tmp/nixl/bin/python SIZES="8 65536 1048576 16777216" benchmarks/compare/nixl.sh
set -euo pipefail
cd "$(dirname "$0")"
python=${NIXL_PYTHON:?give NIXL_PYTHON, a python with nixl-cu13 installed}
sizes=$(echo "${SIZES:-8 65536 1048576 16777216}" | tr ' ' ',')
id=$$
ns_a=tutti-na-$id ns_b=tutti-nb-$id
exchange=$(mktemp -d)
cleanup() {
  ip netns del "$ns_a" 2>/dev/null || true
  ip netns del "$ns_b" 2>/dev/null || true
  rm -rf "$exchange"
}
trap cleanup EXIT
ip netns add "$ns_a" && ip netns add "$ns_b"
ip link add "na$id" type veth peer name "nb$id"
ip link set "na$id" netns "$ns_a" && ip link set "nb$id" netns "$ns_b"
ip -n "$ns_a" addr add 10.233.9.1/24 dev "na$id" && ip -n "$ns_b" addr add 10.233.9.2/24 dev "nb$id"
for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
ip -n "$ns_a" link set "na$id" up && ip -n "$ns_b" link set "nb$id" up
ip netns exec "$ns_a" env UCX_TLS=tcp timeout 300 "$python" nixl_read.py owner "$exchange" "$sizes" \
  >"$exchange/owner.log" 2>&1 &
owner=$!
ip netns exec "$ns_b" env UCX_TLS=tcp timeout 300 "$python" nixl_read.py consumer "$exchange" "$sizes" \
  2>&1 | grep "nixl READ"
wait "$owner" || { echo "nixl.sh: the owner failed:" >&2; cat "$exchange/owner.log" >&2; exit 1; }
