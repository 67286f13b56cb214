# bench/ncu_table.awk: ncu's --print-summary per-kernel output (with the
# gpu__time_duration.sum metric) as one line a kernel and grid: total us,
# launches, mean us, name, grid; unsorted. Used by bench/profile_*_h200.sh:
#     grep -E "^  [a-zA-Z_]|gpu__time_duration" ncu.txt | paste - - | awk -f bench/ncu_table.awk
{
    name = $0; sub(/^ +/, "", name); sub(/\(.*/, "", name); sub(/^void /, "", name)
    grid = $0; sub(/.*\) \(/, "(", grid); sub(/, Device.*/, "", grid)
    inv = $0; sub(/.*Invocations /, "", inv); sub(/[ \t].*/, "", inv)
    unit = $0; sub(/.*gpu__time_duration.sum +/, "", unit); split(unit, f, / +/)
    mean = f[4]; if (f[1] == "ms") mean *= 1000; if (f[1] == "ns") mean /= 1000
    printf "%10.1f us total %6d x %9.2f us  %s %s\n", inv * mean, inv, mean, name, grid
}
