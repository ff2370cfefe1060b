#!/usr/bin/env bash
# Installs what ztrain builds and tests with on Debian 12, skipping what is
# already there. Runs apt-get as root, or through sudo.
set -euo pipefail
packages=(build-essential cmake ninja-build pkg-config
  libboost-dev libboost-program-options-dev libtbb-dev libtomlplusplus-dev doctest-dev
  libopenblas-dev nlohmann-json3-dev libyaml-cpp-dev libpcre2-dev libsentencepiece-dev libprotobuf-dev protobuf-compiler liburing-dev libopenmpi-dev openmpi-bin libgloo-dev libjemalloc-dev
  clang-format iproute2 e2fsprogs)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
