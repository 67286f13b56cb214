#!/bin/sh
# Installs every build and test dependency of QUADS-C on Debian/Ubuntu.
# Idempotent; run it as root, or as a user with sudo: it elevates itself with
# sudo only when not root (so `./ci/install-deps.sh` works in both). Python packages
# are for reference checks in tests only, never for the product; clang and its
# libFuzzer runtime only build the fuzz targets (tests/fuzz/).
set -eu

PKGS="build-essential autoconf automake libtool pkg-config \
libjansson-dev libcurl4-openssl-dev check libpcre2-dev libutf8proc-dev libgmp-dev zlib1g-dev \
python3 python3-pip"
# the libFuzzer targets of tests/fuzz/ (ci/test.sh runs them)
PKGS="$PKGS clang libclang-rt-14-dev"

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

missing=""
for p in $PKGS; do
    dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
    # shellcheck disable=SC2086
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing
fi

# Reference packages for tests (small wheels; tensorboard reads back the
# event files of quads rl). Skipped if already importable.
if ! python3 -c "import numpy, ml_dtypes, tensorboard" >/dev/null 2>&1; then
    python3 -m pip install -q numpy ml_dtypes tensorboard 2>/dev/null ||
        python3 -m pip install -q --break-system-packages numpy ml_dtypes tensorboard
fi
