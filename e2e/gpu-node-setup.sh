#!/usr/bin/env bash
# Runs inside the kind GPU worker (`docker exec -i <node> bash < e2e/gpu-node-setup.sh`), as nvkind does:
# install the NVIDIA container toolkit in the node, make it containerd's default runtime, restart containerd.
set -euo pipefail
# The NVIDIA runtime on the host mounts /proc/driver/nvidia read-only over the node's; the toolkit inside
# the node must see the real one to set up the containers it starts.
umount -R /proc/driver/nvidia 2>/dev/null || true
if ! command -v nvidia-ctk >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends curl gpg ca-certificates >/dev/null
  curl -fsSL https://nvidia.github.io/libnvidia-container/gpgkey \
    | gpg --dearmor -o /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg
  curl -fsSL https://nvidia.github.io/libnvidia-container/stable/deb/nvidia-container-toolkit.list \
    | sed 's#deb https://#deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] https://#g' \
    > /etc/apt/sources.list.d/nvidia-container-toolkit.list
  apt-get update -qq
  apt-get install -y -qq nvidia-container-toolkit >/dev/null
fi
nvidia-ctk runtime configure --runtime=containerd --set-as-default --config-source=command
systemctl restart containerd
echo "gpu-node-setup: containerd uses the NVIDIA runtime"
