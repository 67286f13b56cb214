#!/bin/sh
# The test command of the README: build from scratch and run the Check suites,
# then check that models/tiny regenerates bit for bit. Prints the Check summary
# line last so a CI log shows what was tested.
set -eu
cd "$(dirname "$0")/.."
./autogen.sh >/dev/null 2>&1
./configure -q
make -j"$(nproc)" >/dev/null
status=0
make -j"$(nproc)" check || status=$?
# The shipped tiny model must be what `make tiny-model` makes with today's
# numerics (about 2 minutes on 2 cores).
if [ "$status" = 0 ]; then
    make tiny-model-check || status=$?
fi
# The tarball: make distcheck without CUDA (issue 16; ci/distcheck.sh).
if [ "$status" = 0 ]; then
    ./ci/distcheck.sh || status=$?
fi
if [ "$status" != 0 ]; then
    for f in tests/*.log; do echo "==> $f"; tail -n 60 "$f"; done
fi
grep -h '^[0-9]*%: Checks:' tests/quads_tests.log || echo "no Check summary found"
exit "$status"
