#!/usr/bin/env bash
# The Debian bookworm root filesystem a kind node image is made of (hack/kind/build-node-image.sh): systemd as PID 1,
# Debian's runc and CNI plugins, the networking tools the kubelet and kube-proxy call. debootstrap from the Debian
# mirror apt on this machine already uses, as hack/images/build-base.sh does: no image is pulled.
#
# Output: the tarball's path on stdout, cached by the package list (re-running with it present does nothing).
set -euo pipefail

cache="${XDG_CACHE_HOME:-$HOME/.cache}/strata/kind"
# Bookworm's systemd (252) still runs on cgroup v1 hosts like this one; later releases dropped v1.
packages="systemd,systemd-sysv,dbus,iptables,conntrack,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,runc"
packages+=",containernetworking-plugins,ca-certificates,procps,bash,socat"
tarball="$cache/rootfs-bookworm-$(sha256sum <<<"$packages" | cut -c1-12).tar"
if [[ -s "$tarball" ]]; then echo "$tarball"; exit 0; fi

command -v debootstrap >/dev/null || { echo "kind rootfs: debootstrap missing (make system installs it)" >&2; exit 1; }
mkdir -p "$cache"
exec 8>"$cache/rootfs.lock"
flock 8
if [[ -s "$tarball" ]]; then echo "$tarball"; exit 0; fi

apt_mirror() {  # the first Debian archive URI in apt's sources (deb822 or one-line format)
  local uri
  uri="$(grep -hsE '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v security | head -n1)"
  [[ -n "$uri" ]] || uri="$(grep -hsE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
                            | awk '{print $2}' | grep -v security | head -n1)"
  [[ -n "$uri" ]] || { echo "kind rootfs: no Debian mirror in apt's sources" >&2; return 1; }
  echo "$uri"
}

rootfs="$(mktemp -d "$cache/rootfs.XXXXXX")"
trap 'rm -rf "$rootfs"' EXIT
start=$SECONDS
echo "kind rootfs: debootstrap bookworm minbase + systemd, runc, CNI plugins (first time only; a few minutes)" >&2
debootstrap --variant=minbase --include="$packages" bookworm "$rootfs" "$(apt_mirror)" >"$cache/debootstrap.log" 2>&1 \
  || { tail -n 20 "$cache/debootstrap.log" >&2; exit 1; }
rm -rf "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/{doc,man,info,locale}/* \
       "$rootfs"/var/log/* "$rootfs"/tmp/*
tar --numeric-owner -C "$rootfs" -cf "$tarball.partial" .
mv "$tarball.partial" "$tarball"
echo "kind rootfs: built in $((SECONDS - start))s ($(du -m "$tarball" | cut -f1) MB)" >&2
echo "$tarball"
