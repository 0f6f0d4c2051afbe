# shellcheck shell=bash
# Sourced by the image build scripts (hack/node/build-images.sh, hack/node/build-serving-image.sh): a Docker daemon
# for the build, and a wheelhouse that pip inside the build reads over loopback. pip inside a build cannot verify
# this machine's TLS (its CA bundle is the host's, not the image's), so the scripts download the packages on the
# host, with the host's pip settings, and the builds install from there with PIP_NO_INDEX.

started_dockerd=""
wheelhouse_server=""
wheelhouse_url=""

# ensure_dockerd LOG: starts dockerd when none answers: no default bridge and no iptables rules, so the node's pod
# network is left alone (kind's own network still works). Where this host's capability bounding set lacks
# capabilities, runc-bounded is the default runtime, so privileged containers (kind's nodes) start.
# stop_dockerd stops only a daemon started here.
ensure_dockerd() {
  docker info >/dev/null 2>&1 && return 0
  command -v dockerd >/dev/null || { echo "images: no dockerd (make system installs docker.io)" >&2; return 1; }
  local args=(--iptables=false --ip-masq=false --bridge=none)
  if ! host_grants_all_capabilities; then
    args+=(--add-runtime "runc-bounded=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/runc-bounded"
           --default-runtime runc-bounded)
  fi
  dockerd "${args[@]}" >"$1" 2>&1 &
  started_dockerd=$!
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && return 0; sleep 1; done
  tail -n 20 "$1" >&2
  return 1
}

host_grants_all_capabilities() {  # whether this process's bounding set holds every capability the kernel has
  local last bounding
  last="$(cat /proc/sys/kernel/cap_last_cap)"
  bounding="$(awk '/^CapBnd:/ {print $2}' /proc/self/status)"
  (( 16#$bounding == (1 << (last + 1)) - 1 ))
}

stop_dockerd() {
  if [[ -n "$started_dockerd" ]]; then kill "$started_dockerd"; wait "$started_dockerd" || true; fi
  started_dockerd=""
}

# serve_wheelhouse DIR: serves DIR on a free loopback port and sets wheelhouse_url (a PIP_FIND_LINKS value).
serve_wheelhouse() {
  local port
  port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  python3 -m http.server --bind 127.0.0.1 --directory "$1" "$port" >/dev/null 2>&1 &
  wheelhouse_server=$!
  wheelhouse_url="http://127.0.0.1:$port/"
  for _ in $(seq 50); do
    python3 -c "import urllib.request; urllib.request.urlopen('$wheelhouse_url')" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "images: the wheelhouse server on $wheelhouse_url did not answer" >&2
  return 1
}

stop_wheelhouse() {
  if [[ -n "$wheelhouse_server" ]]; then kill "$wheelhouse_server" 2>/dev/null || true; fi
  wheelhouse_server=""
}
