#!/bin/sh
# `make run`: colad under supervisord against a sandbox, with colad's own kubelet
# simulator, so registration, the device list and an Allocate answer show up in
# the terminal. Ctrl-C stops everything.
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
sandbox="$top/.sandbox"
mkdir -p "$sandbox/colas" "$sandbox/kubelet"
# The devices of the original blog post: one file each.
touch "$sandbox/colas/cocacola" "$sandbox/colas/peisicola"

export COLAD_CONFIG="$top/conf/colad.toml"
export COLAD_DEVICE_DIR="$sandbox/colas"
export COLAD_KUBELET_DIR="$sandbox/kubelet"
export COLAD_RUN_DIR="$sandbox/run"
export COLAD_CDI_SPEC_DIR="$sandbox/cdi"
export COLAD_METRICS_ADDRESS="127.0.0.1:9647"
colad="$top/.venv/bin/colad"

"$colad" kubelet-sim --allocate 2 &
sim=$!
trap 'kill $sim 2>/dev/null || true' EXIT
echo "colad demo: devices in $COLAD_DEVICE_DIR (add or remove files to see the list change); Ctrl-C to stop"
# supervisord replaces `colad supervise` and stays in the foreground; Ctrl-C
# reaches it and the simulator, and supervisord stops the three roles.
"$colad" supervise || true
