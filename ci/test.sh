#!/bin/sh
# The test command of the README: build from scratch and run the Check suites.
# Prints the Check summary line last so a CI log shows what was tested.
set -eu
cd "$(dirname "$0")/.."
./autogen.sh >/dev/null 2>&1
./configure -q
make -j"$(nproc)" >/dev/null
status=0
make -j"$(nproc)" check || status=$?
if [ "$status" != 0 ]; then
    for f in tests/*.log; do echo "==> $f"; tail -n 60 "$f"; done
fi
grep -h '^[0-9]*%: Checks:' tests/quads_tests.log || echo "no Check summary found"
exit "$status"
