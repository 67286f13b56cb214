#!/bin/sh
# make distcheck without CUDA: the tarball configures, builds, passes make check
# out of its (read-only) tree, installs (installcheck compiles a program against
# quads.pc), uninstalls and cleans. The main CI build compiles the CUDA sources;
# this one checks the packaging. Then every file git tracks must be in the
# tarball (but .gitignore files, .ci/ and m4/.keep), so that a new script or
# document left out of EXTRA_DIST fails here, named. A few minutes on 2 cores.
set -eu
cd "$(dirname "$0")/.."
make -j"$(nproc)" distcheck DISTCHECK_CONFIGURE_FLAGS="--without-cuda" >distcheck.log 2>&1 || {
    tail -n 80 distcheck.log
    exit 1
}
grep -A3 'archives ready for distribution' distcheck.log
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    tarball=$(grep -A1 'archives ready for distribution' distcheck.log | tail -n 1)
    list=$(mktemp)
    tar tzf "$tarball" | sed "s|^${tarball%.tar.gz}/||" | sort >"$list"
    missing=$(git ls-files | grep -v -e '\.gitignore$' -e '^\.ci/' -e '^m4/\.keep$' | sort | comm -23 - "$list")
    rm -f "$list"
    if [ -n "$missing" ]; then
        echo "$tarball lacks files git tracks (add them to EXTRA_DIST in Makefile.am):"
        echo "$missing"
        exit 1
    fi
    echo "$tarball holds every file git tracks"
fi
