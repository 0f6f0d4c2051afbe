#!/usr/bin/env bash
# Generates strata_kv/csi's Python gRPC modules from its two .proto files (`make csi-protos`). The output is
# committed, so the runtime image needs neither protoc nor grpcio-tools; kvserver/tests/unit/test_csi_protos.py
# runs this into a temporary directory and fails when the committed modules differ.
# Usage: hack/csi-protos.sh [OUTPUT_ROOT]   (default: kvserver, i.e. in place)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
out="${1:-$root/kvserver}"
mkdir -p "$out/strata_kv/csi"
cd "$root/kvserver"
"$python" -m grpc_tools.protoc -I . --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  strata_kv/csi/csi.proto strata_kv/csi/pluginregistration.proto
