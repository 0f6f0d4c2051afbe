#!/usr/bin/env bash
# Builds a kind node image with no image pull, from the parts this project already builds: the Debian root
# filesystem with systemd, runc and the CNI plugins (hack/kind/build-rootfs.sh), containerd 2 (hack/build-containerd.sh),
# the kubelet, kubeadm and kubectl, and the images kubeadm runs (kube-apiserver, kube-controller-manager,
# kube-scheduler, kube-proxy, etcd, CoreDNS, pause) made here from the same v1.37.2 build and preloaded into the
# node's containerd, so no node pulls anything either. What a node holds beyond that (its entrypoint, the systemd
# units, containerd's configuration, the pod network service) is under hack/kind/node/; e2e/README.md says how
# this image differs from kind's stock one.
#
# The images carry the names `kubeadm config images list` prints, so kubeadm finds them; their contents are what
# this project builds (CoreDNS and etcd at the versions hack/coredns and hack/etcd pin, which may differ from the tag).
#
# Cached by a hash of everything that goes in (binaries, root filesystem, files, this script): the image in Docker as
# strata-kind-node:<k8s version>-<hash>, its parts in ~/.cache/strata (the root filesystem tarball in .../kind).
# Re-running with the image present does nothing; without it, the image is assembled again from the cached parts. Needs root (debootstrap, chroot, a containerd of its own for the preload) and Docker.
#
# Output: the image reference on stdout.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
hack="$root/hack"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/strata/kind"
k8s_version="$(awk '$1=="require" && $2=="k8s.io/kubernetes" {print $3}' "$hack/controlplane/go.mod")"
bin_dir="${STRATA_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/strata/bin/${k8s_version}}"
mkdir -p "$cache"
start=$SECONDS

# The parts, each built once into its own cache (each script does nothing when its outputs are there).
bash "$hack/build-controlplane.sh" >&2
bash "$hack/build-node.sh" >&2
bash "$hack/build-kind.sh" >/dev/null
containerd_dir="$(bash "$hack/build-containerd.sh" | tail -n1)"
rootfs_tar="$(bash "$hack/kind/build-rootfs.sh")"

k8s_bins=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubeadm kubectl etcd coredns)
containerd_bins=(containerd containerd-shim-runc-v2 ctr)

inputs_hash() {
  {
    (cd "$bin_dir" && sha256sum "${k8s_bins[@]}")
    (cd "$containerd_dir" && sha256sum "${containerd_bins[@]}")
    basename "$rootfs_tar"
    (cd "$root" && find hack/kind hack/node/pause.c -type f -print0 | sort -z | xargs -0 sha256sum)
  } | sha256sum | cut -c1-12
}
hash="$(inputs_hash)"
ref="${KIND_NODE_IMAGE_REF:-strata-kind-node:${k8s_version}-${hash}}"
node_tar="$cache/node-${k8s_version}-${hash}.tar"

# shellcheck source=hack/images/lib.sh disable=SC1091
source "$hack/images/lib.sh"
work=""
cleanup() {
  if [[ -n "${preload_pid:-}" ]]; then kill "$preload_pid" 2>/dev/null || true; wait "$preload_pid" 2>/dev/null || true; fi
  if [[ -n "$work" ]]; then rm -rf "$work"; fi
  stop_dockerd
}
trap cleanup EXIT
ensure_dockerd "$cache/dockerd.log"

import_node() {  # the node image from its root filesystem tarball: systemd as PID 1 behind the entrypoint
  local rootfs_ref="strata-kind-node-rootfs:${ref##*:}"
  docker import \
    --change 'ENV container=docker' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    "$node_tar" "$rootfs_ref" >/dev/null
  # `docker import` takes no STOPSIGNAL: one more (empty) step sets it, so `docker stop` halts systemd cleanly.
  printf 'FROM %s\nSTOPSIGNAL SIGRTMIN+3\nENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]\n' "$rootfs_ref" \
    | DOCKER_BUILDKIT=0 docker build --quiet --tag "$ref" - >/dev/null 2>&1
  docker rmi "$rootfs_ref" >/dev/null
}

if docker image inspect "$ref" >/dev/null 2>&1; then echo "$ref"; exit 0; fi

echo "kind node image: building $ref (first time only; a few minutes)" >&2
work="$(mktemp -d "$cache/build.XXXXXX")"
nodefs="$work/node"
mkdir -p "$nodefs"
tar --numeric-owner -xpf "$rootfs_tar" -C "$nodefs"

# --- The images kubeadm runs, each one layer: the binary and the shared libraries it loads (taken from the node's
# own root filesystem, the same Debian release the binaries were built on), plus iptables and conntrack, which
# kube-proxy calls.
images="$("$bin_dir/kubeadm" config images list --kubernetes-version "$k8s_version")"
image_ref() {  # image_ref NAME: the reference kubeadm expects for NAME
  local found
  found="$(grep -E "/$1:" <<<"$images")" || { echo "kind node image: kubeadm lists no $1 image" >&2; return 1; }
  echo "$found"
}

copy_from_node() {  # copy_from_node DEST PATH...: PATHs out of the node's root filesystem, links followed
  local dest="$1"
  shift
  tar -C "$nodefs" -chf - "${@#/}" | tar -C "$dest" -xf -
}

libraries_of() {  # libraries_of FILE: the shared libraries FILE loads, as ldd inside the node's filesystem sees them
  local file="$1"
  if [[ "$file" != "$nodefs"/* ]]; then cp "$file" "$nodefs/tmp/probe" && file=/tmp/probe; else file="${file#"$nodefs"}"; fi
  chroot "$nodefs" ldd "$file" 2>/dev/null | grep -oE '/[^ ]+' || true
  rm -f "$nodefs/tmp/probe"
}

slim_base="$work/slim"
mkdir -p "$slim_base"/{tmp,etc,usr/sbin,usr/local/bin,var/run}
chmod 1777 "$slim_base/tmp"
xtables_dir="$(cd "$nodefs" && compgen -G 'usr/lib/*-linux-gnu/xtables' | head -n1)"  # the node's architecture's
copy_from_node "$slim_base" /usr/sbin/xtables-nft-multi /usr/sbin/conntrack "/$xtables_dir" \
  /etc/nsswitch.conf /etc/protocols /etc/services /etc/passwd /etc/group /etc/ssl/certs/ca-certificates.crt
# iptables loads its match and target extensions with dlopen, so ldd of the binary does not name what they need
# (libxt_statistic, which kube-proxy uses for every Service with more than one endpoint, needs libm): every
# extension's libraries come too.
# shellcheck disable=SC2046  # one path per word
copy_from_node "$slim_base" $( (libraries_of "$nodefs/usr/sbin/xtables-nft-multi"; libraries_of "$nodefs/usr/sbin/conntrack"
  for extension in "$nodefs/$xtables_dir"/*.so; do libraries_of "$extension"; done) | sort -u)
for tool in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
  ln -s xtables-nft-multi "$slim_base/usr/sbin/$tool"
done

component_image() {  # component_image NAME BINARY ENTRYPOINT-JSON
  local name="$1" binary="$2" entrypoint="$3" dir="$work/img-$1"
  cp -a "$slim_base" "$dir"
  cp "$binary" "$dir/usr/local/bin/"
  # shellcheck disable=SC2046
  copy_from_node "$dir" $(libraries_of "$binary")
  local args=(--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin')
  if [[ -n "$entrypoint" ]]; then args+=(--change "ENTRYPOINT $entrypoint"); fi
  tar --numeric-owner -C "$dir" -cf - . | docker import "${args[@]}" - "$(image_ref "$name")" >/dev/null
  rm -rf "$dir"
}
component_image kube-apiserver "$bin_dir/kube-apiserver" ""
component_image kube-controller-manager "$bin_dir/kube-controller-manager" ""
component_image kube-scheduler "$bin_dir/kube-scheduler" ""
component_image kube-proxy "$bin_dir/kube-proxy" ""
component_image etcd "$bin_dir/etcd" ""
component_image coredns "$bin_dir/coredns" '["/usr/local/bin/coredns"]'

pause_dir="$work/pause"
mkdir -p "$pause_dir"
gcc -static -O2 -o "$pause_dir/pause" "$root/hack/node/pause.c"
tar -C "$pause_dir" -cf - pause | docker import --change 'ENTRYPOINT ["/pause"]' - "$(image_ref pause)" >/dev/null

mapfile -t refs <<<"$images"
docker save -o "$work/images.tar" "${refs[@]}"
docker rmi "${refs[@]}" >/dev/null  # they live on in the node image; Docker keeps no second copy
echo "kind node image: $(du -m "$work/images.tar" | cut -f1) MB of images to preload" >&2

# --- Preload: a containerd of our own, rooted in the node's /var/lib/containerd, imports the images without
# unpacking them (the node's containerd unpacks each on first use). kind gives every node a fresh /var volume that
# Docker fills from the image, so each node starts with them.
cat >"$work/preload.toml" <<EOF
version = 3
root = "$nodefs/var/lib/containerd"
state = "$work/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.images", "io.containerd.cri.v1.runtime",
                    "io.containerd.nri.v1.nri"]
[grpc]
  address = "$work/containerd.sock"
[ttrpc]
  address = "$work/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$work/opt"
EOF
"$containerd_dir/containerd" --config "$work/preload.toml" >"$work/preload.log" 2>&1 &
preload_pid=$!
for _ in $(seq 100); do
  "$containerd_dir/ctr" -a "$work/containerd.sock" version >/dev/null 2>&1 && break
  sleep 0.2
done
"$containerd_dir/ctr" -a "$work/containerd.sock" -n k8s.io images import --all-platforms --no-unpack --digests \
  "$work/images.tar" >/dev/null || { tail -n 20 "$work/preload.log" >&2; exit 1; }
kill "$preload_pid"
wait "$preload_pid" || true
preload_pid=""
rm -f "$work/images.tar"

# --- The node's own programs and files.
for bin in kubelet kubeadm kubectl; do cp "$bin_dir/$bin" "$nodefs/usr/local/bin/"; done
for bin in "${containerd_bins[@]}"; do cp "$containerd_dir/$bin" "$nodefs/usr/local/bin/"; done
cp -a "$hack/kind/node/." "$nodefs/"
sed -i "s#@PAUSE_IMAGE@#$(image_ref pause)#" "$nodefs/etc/containerd/config.toml"
printf '%s' "$k8s_version" >"$nodefs/kind/version"
mkdir -p "$nodefs/etc/kubernetes/manifests" "$nodefs/etc/cni/net.d"

# systemd in a container: only the units a node needs start (no getty, udev, or the tmpfiles pass that would
# empty what Docker mounted), and journald does not read the host's kernel log.
rm -f "$nodefs"/lib/systemd/system/multi-user.target.wants/* "$nodefs"/etc/systemd/system/*.wants/* \
      "$nodefs"/lib/systemd/system/local-fs.target.wants/* "$nodefs"/lib/systemd/system/sockets.target.wants/*udev* \
      "$nodefs"/lib/systemd/system/sockets.target.wants/*initctl* "$nodefs"/lib/systemd/system/basic.target.wants/* \
      "$nodefs"/lib/systemd/system/sysinit.target.wants/systemd-tmpfiles-setup.service
echo "ReadKMsg=no" >>"$nodefs/etc/systemd/journald.conf"
chroot "$nodefs" systemctl enable containerd.service kubelet.service strata-podnet.service >/dev/null 2>&1
chroot "$nodefs" systemctl mask systemd-binfmt.service getty.target console-getty.service >/dev/null 2>&1

tar --numeric-owner -C "$nodefs" -cf "$node_tar.partial" .
mv "$node_tar.partial" "$node_tar"
size_mb="$(du -m "$node_tar" | cut -f1)"
import_node
# Docker's copy is the cache: the tarball (about 1 GB) goes, and a rebuild from the cached parts takes under a minute.
rm -f "$node_tar"
echo "kind node image: $ref built in $((SECONDS - start))s (${size_mb} MB)" >&2
echo "$ref"
