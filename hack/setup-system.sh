#!/usr/bin/env bash
# Installs the Debian packages the tests and demo use, only when missing: real servers and clients, and the
# real node's runtime (runc, CNI plugins, iptables; containerd 2 is built by hack/build-containerd.sh) and image
# builds (docker.io, debootstrap; zstd compresses the serving image's archives); qemu-user runs the vLLM kernel
# check on emulated CPUs this machine is not (kvserver/tests/vllm/test_cpu_kernels.py).
set -euo pipefail
packages=(redis-server redis-tools shellcheck runc containernetworking-plugins iptables conntrack
          docker.io debootstrap zstd qemu-user)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
  echo "system: installing ${missing[*]}"
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Debian starts redis-server as a service on install; the tests start their own on free ports.
if command -v service >/dev/null && pgrep -x redis-server >/dev/null 2>&1; then
  service redis-server stop >/dev/null 2>&1 || true
fi
exit 0
