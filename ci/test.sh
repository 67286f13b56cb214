#!/bin/sh
# The test command of the README: build from scratch and run the Check suites,
# then check that models/tiny regenerates bit for bit; then the same suites
# again under ASan+UBSan and a short run of every libFuzzer target. Prints the
# Check summary lines last so a CI log shows what was tested.
set -eu
cd "$(dirname "$0")/.."
jobs=$(nproc)
./autogen.sh >/dev/null 2>&1
./configure -q
make -j"$jobs" >/dev/null
status=0
make -j"$jobs" check || status=$?
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

# The Check suites under AddressSanitizer and UndefinedBehaviorSanitizer, in a
# copy of the tree (build-asan/): the first report of either fails the run, and
# so does a leak. About 4 minutes on 2 cores. Check forks a child per test; each
# child runs LeakSanitizer at its exit, so a leak fails the test that made it.
# No suppressions.
asan=0
if [ "$status" = 0 ]; then
    ./ci/copy-tree.sh build-asan
    (
        cd build-asan
        ./autogen.sh >/dev/null 2>&1
        ./configure -q --without-cuda \
            CFLAGS='-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all' \
            LDFLAGS='-fsanitize=address,undefined'
        make -j"$jobs" >/dev/null
        # the sanitizers slow the suites about 2x: Check's timeouts with them
        ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:abort_on_error=1 \
        UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 CK_TIMEOUT_MULTIPLIER=3 \
            make -j"$jobs" check
    ) || asan=$?
    if [ "$asan" != 0 ]; then
        status=$asan
        for f in build-asan/tests/*.log; do echo "==> $f"; grep -B2 -A30 -E 'ERROR: |runtime error|:[EF]:' "$f" | head -n 120; done
    fi
fi

# Every libFuzzer target for 4 s on the fixtures' seeds (tests/fuzz/README.md
# has the longer run).
if [ "$status" = 0 ]; then
    sh tests/fuzz/run.sh 4 || status=$?
fi

grep -h '^[0-9]*%: Checks:' tests/quads_tests.log || echo "no Check summary found"
if [ -f build-asan/tests/quads_tests.log ]; then
    printf 'ASan+UBSan: '
    grep -h '^[0-9]*%: Checks:' build-asan/tests/quads_tests.log || echo "no Check summary found"
fi
exit "$status"
