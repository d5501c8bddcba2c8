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
  nodejs chromium
)
# npm comes with some nodejs builds (NodeSource's); Debian packages it apart.
if ! command -v npm >/dev/null 2>&1; then packages+=(npm); fi

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages already installed"
else
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The server's client tests (tests/node): the OpenAI Node client and
# puppeteer-core, at the versions in package-lock.json.
node_dir="$(dirname "$0")/../tests/node"
stamp="$node_dir/node_modules/.longctx-installed-from-lock"  # the lock file npm ci last installed
if ! cmp -s "$node_dir/package-lock.json" "$stamp" 2>/dev/null; then
  echo "install-deps: npm ci in tests/node"
  (cd "$node_dir" && npm ci --no-audit --no-fund --loglevel=error)
  cp "$node_dir/package-lock.json" "$stamp"
else
  echo "install-deps: tests/node packages already installed"
fi
