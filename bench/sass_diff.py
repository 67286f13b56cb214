"""Compares the SASS of two builds of one CUDA object, function by function
(issue 12's kernels: "every existing kernel SASS-identical" for a change that
adds an opt-in beside them). Needs cuobjdump, which the development box's CUDA
install lacks: PyPI's wheel has it,
    python3 -m pip download --no-deps nvidia-cuda-cuobjdump -d /tmp/whl
    python3 -m zipfile -e /tmp/whl/nvidia_cuda_cuobjdump-*.whl /tmp/cutools
    chmod +x /tmp/cutools/nvidia/cu13/bin/cuobjdump
(nvidia-cuda-nvdisasm the same way, for nvdisasm).
    python3 bench/sass_diff.py OLD.o NEW.o [--cuobjdump PATH] [--count NAME]
OLD.o: e.g. `git stash; make backends/cuda/cuda_quant.o; cp backends/cuda/cuda_quant.o /tmp/old.o;
git stash pop; make backends/cuda/cuda_quant.o`. Prints how many functions of OLD have
the same instructions in NEW (addresses and encodings aside), which differ, which
are gone and which are new. A function whose template gained a trailing
parameter is matched by --rename OLDPREFIX=NEWPREFIX pairs (mangled names).
--count NAME: the instruction mix of the functions whose mangled name contains
NAME (in NEW), one line per opcode, most frequent first."""
import argparse
import collections
import re
import subprocess
import sys


def functions(obj, tool):
    out = subprocess.run([tool, "-sass", obj], capture_output=True, text=True, check=True).stdout
    funcs, cur = {}, None
    for line in out.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = m.group(1)
            funcs[cur] = []
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s*([^;]*;)", line)
        if m and cur:
            funcs[cur].append(m.group(1).strip())
    return funcs


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--cuobjdump", default="/tmp/cutools/nvidia/cu13/bin/cuobjdump")
    p.add_argument("--rename", action="append", default=[], help="OLDPREFIX=NEWPREFIX")
    p.add_argument("--count", help="instruction mix of NEW's functions whose name contains this")
    a = p.parse_args()
    old, new = functions(a.old, a.cuobjdump), functions(a.new, a.cuobjdump)
    ren = [r.split("=", 1) for r in a.rename]

    def mapped(name):
        for o, n in ren:
            if name.startswith(o):
                return n + name[len(o):]
        return name

    same, differ, gone = [], [], []
    for k, v in old.items():
        k2 = mapped(k)
        if k2 not in new:
            gone.append(k)
        elif new[k2] == v:
            same.append(k)
        else:
            differ.append(k)
    seen = {mapped(k) for k in old}
    added = [k for k in new if k not in seen]
    print(f"{len(old)} functions in {a.old}: {len(same)} SASS-identical in {a.new}, "
          f"{len(differ)} differ, {len(gone)} gone; {len(added)} new")
    for k in differ:
        print(f"  differs: {k} ({len(old[k])} -> {len(new[mapped(k)])} instructions)")
    for k in gone:
        print(f"  gone: {k}")
    for k in added:
        print(f"  new: {k} ({len(new[k])} instructions)")
    if a.count:
        for k, v in new.items():
            if a.count in k:
                mix = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", i).split()[0].split(".")[0] for i in v)
                print(f"{k}: {len(v)} instructions")
                for op, n in mix.most_common():
                    print(f"  {n:6d} {op}")
    return 1 if differ or gone else 0


if __name__ == "__main__":
    sys.exit(main())
