#!/usr/bin/env bash
# Installs every build and test dependency of longctx from Debian 12 packages.
# Nothing is downloaded at build time and nothing is vendored. The CUDA
# toolkit is optional (LONGCTX_CUDA=AUTO builds gpu/ only when nvcc is found)
# and is not installed here.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libtbb-dev libdnnl-dev libhwloc-dev hwloc libyaml-cpp-dev libhwy-dev libpcre2-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libcpp-httplib-dev nlohmann-json3-dev
  pybind11-dev python3-dev python3-numpy python3-yaml python3-pytest python3-torch
  tmux gnuplot-nox
)

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages already installed"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
