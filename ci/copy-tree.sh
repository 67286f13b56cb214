#!/bin/sh
# Copies the working tree's sources (tracked files and untracked ones git does
# not ignore, so uncommitted edits are included) into DEST, for a second build
# with other compilers or flags (ci/test.sh's sanitizer build, tests/fuzz/run.sh).
# A copy rather than an out-of-tree build: automake refuses one while the source
# tree has an in-tree build, which the README's commands make.
# Usage: ci/copy-tree.sh DEST
set -eu
dest=$1
cd "$(dirname "$0")/.."
mkdir -p "$dest"
git ls-files -z --cached --others --exclude-standard |
    tar --null --no-recursion --ignore-failed-read -T - -cf - | tar -xf - -C "$dest"
