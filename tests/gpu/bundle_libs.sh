#!/bin/sh
# On the development box: copies the shared libraries of ./quads that the GPU
# machine lacks (everything but glibc and the compiler runtime) into
# .devrun/lib, to be carried with the device tool (tests/gpu/run_all.sh sets
# LD_LIBRARY_PATH to it).
#     sh tests/gpu/bundle_libs.sh
set -eu
cd "$(dirname "$0")/../.."
mkdir -p .devrun/lib
for l in $(ldd ./quads | awk '{print $3}' | grep '^/'); do
    case $(basename "$l") in
    libc.so* | libm.so* | libstdc++* | libgcc_s* | libresolv* | ld-linux* | libpthread* | libdl* | librt* | libcublas* | libcudart*) ;;
    *) cp -L "$l" .devrun/lib/ ;;
    esac
done
du -sh .devrun/lib
