#!/usr/bin/env bash
# Shared by the build scripts (sourced, not run): build one command from a module under hack/ into the cache,
# once, and the version stamp Kubernetes binaries carry. Callers set `here`, `bin_dir` and `label`.
# shellcheck disable=SC2154  # here, bin_dir and label are the caller's

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
