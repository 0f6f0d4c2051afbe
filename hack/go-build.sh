#!/usr/bin/env bash
# Shared by the build scripts (sourced, not run): build one command from a module under hack/ into the cache,
# once, and the version stamp Kubernetes binaries carry. Callers set `here`, `bin_dir` and `label`.
# shellcheck disable=SC2154  # here, bin_dir and label are the caller's

# Go's build cache for these builds is the project's own, under its cache, not the user's: it is scratch space the
# builds share (the Kubernetes commands compile the same packages) and `make setup` lets it go once every binary is
# built (hack/trim-go-cache.sh: about 6.6 GB). Each build script holds it shared while it runs, so a trim never
# pulls it from under a build another session started.
export GOCACHE="${XDG_CACHE_HOME:-$HOME/.cache}/strata/go-build"
mkdir -p "$GOCACHE"
exec 7>"$GOCACHE.lock"
flock -s 7

build() {  # build <module dir> <output name> <package> [extra ldflags]
  local dir="$1" name="$2" pkg="$3" extra="${4:-}"
  if [[ -x "$bin_dir/$name" ]]; then return 0; fi
  echo "$label: building $name ($pkg) into $bin_dir (first time only; several minutes)"
  local start=$SECONDS
  (cd "$here/$dir" && go build -trimpath -ldflags="-s -w $extra" -o "$bin_dir/$name.partial.$$" "$pkg")
  mv "$bin_dir/$name.partial.$$" "$bin_dir/$name"  # a per-process name: two builds at once never share one
  echo "$label: built $name in $((SECONDS - start))s"
}

kubernetes_stamp() {  # kubernetes_stamp <version>: so `kubectl version` and skew checks see it, not v0.0.0-master
  local version="$1" minor
  minor="$(cut -d. -f2 <<<"${version#v}")"
  echo "-X k8s.io/component-base/version.gitVersion=${version} -X k8s.io/component-base/version.gitMajor=1" \
       "-X k8s.io/component-base/version.gitMinor=${minor} -X k8s.io/component-base/version.gitTreeState=clean"
}

# The programs the real node runs beside Kubernetes' own (containerd, the registry) are cached per version of
# their module, not per Kubernetes version: pinned_version <module dir> <module path> prints the version go.mod
# pins, and static_build <module dir> <output name> <package> <tags> <ldflags> builds one cgo-free binary into
# `bin_dir` (the caller holds a lock on it; see hack/build-containerd.sh).
pinned_version() {  # a one-line `require m v` or a line `m v` inside a require block
  local version
  version="$(awk -v m="$2" '($1=="require" && $2==m) {print $3} ($1==m) {print $2}' "$here/$1/go.mod")"
  [[ -n "$version" ]] || { echo "$label: $2 is not pinned in hack/$1/go.mod" >&2; return 1; }
  echo "$version"
}

static_build() {
  local dir="$1" name="$2" pkg="$3" tags="$4" ldflags="$5"
  if [[ -x "$bin_dir/$name" ]]; then return 0; fi
  echo "$label: building $name ($pkg) into $bin_dir (first time only; several minutes)" >&2
  local start=$SECONDS
  (cd "$here/$dir" && CGO_ENABLED=0 go build -trimpath -tags "$tags" -ldflags "-s -w $ldflags" \
     -o "$bin_dir/$name.partial" "$pkg")
  mv "$bin_dir/$name.partial" "$bin_dir/$name"
  echo "$label: built $name in $((SECONDS - start))s" >&2
}

lock_bin_dir() {  # one build at a time per cache dir (two test sessions starting at once build once)
  mkdir -p "$bin_dir"
  exec 9>"$bin_dir.lock"
  flock 9
}
