#!/bin/sh
# make distcheck without CUDA: the tarball configures, builds, passes make check
# out of its (read-only) tree, installs (installcheck compiles a program against
# quads.pc), uninstalls and cleans. The main CI build compiles the CUDA sources;
# this one checks the packaging. A few minutes on 2 cores.
set -eu
cd "$(dirname "$0")/.."
make -j"$(nproc)" distcheck DISTCHECK_CONFIGURE_FLAGS="--without-cuda" >distcheck.log 2>&1 || {
    tail -n 80 distcheck.log
    exit 1
}
grep -A3 'archives ready for distribution' distcheck.log
