#!/bin/sh
# make check: programmatic dependent launch (QUADS_PDL=1) is only safe where
# every kernel the backend launches waits for its predecessor before it reads
# or writes anything (backends/cuda/cuda_check.h, QD_PDL_ENTRY). Fails naming
# each __global__ function of backends/cuda whose body does not start with
# QD_PDL_ENTRY();, and each <<< >>> launch left outside qd_launch (which alone
# sets the attribute). It fails when either check is broken on purpose: a
# kernel's first line removed, a launch written back as <<< >>>.
set -u
srcdir=${srcdir:-.}
py=${PYTHON:-python3}
"$py" - "$srcdir"/backends/cuda/*.cu "$srcdir"/backends/cuda/*.cuh "$srcdir"/backends/cuda/*.h <<'PY'
import re, sys

bad = 0
kernels = 0
for path in sys.argv[1:]:
    src = open(path).read()
    # comments out, lengths kept (line numbers stay right)
    code = re.sub(r'/\*.*?\*/|//[^\n]*', lambda m: re.sub(r'[^\n]', ' ', m.group(0)), src, flags=re.S)
    for m in re.finditer(r'\b__global__\b', code):
        depth, k = 0, m.end()
        while k < len(code):
            c = code[k]
            if c == '(':
                depth += 1
            elif c == ')':
                depth -= 1
            elif depth == 0 and c in ';{':
                break
            k += 1
        if k >= len(code) or code[k] == ';':
            continue  # a declaration
        kernels += 1
        if not code[k + 1:].lstrip().startswith('QD_PDL_ENTRY();'):
            line = code.count('\n', 0, m.start()) + 1
            name = re.search(r'(\w+)\s*\($', code[m.end():code.index('(', m.end()) + 1])
            print('%s:%d: kernel %s does not start with QD_PDL_ENTRY();' % (path, line, name.group(1) if name else '?'))
            bad += 1
    if not path.endswith('cuda_check.h'):
        for m in re.finditer(r'<<<', code):
            print('%s:%d: a <<< >>> launch: launch through qd_launch' % (path, code.count('\n', 0, m.start()) + 1))
            bad += 1
if kernels < 100:
    print('pdl_entry: only %d kernels found: the scan is broken' % kernels)
    bad += 1
print('pdl_entry: %d kernels, %d problems' % (kernels, bad))
sys.exit(1 if bad else 0)
PY
