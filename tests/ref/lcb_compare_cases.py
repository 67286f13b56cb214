"""Expected verdicts of LiveCodeBench's stdout comparison for pairs of outputs.

Writes tests/fixtures/code/compare_cases.jsonl: one {"got", "expected", "equal"}
per line (and tests/fixtures/code/json_equal_cases.jsonl: pairs of JSON texts
with Python's json.loads(a) == json.loads(b), the functional comparison), where "equal" is what LiveCodeBench's grade_stdio decides
(LiveCodeBench/LiveCodeBench@28fef95 lcb_runner/evaluation/testing_util.py:
get_stripped_lines, then per line string equality or else equal lists of
decimal.Decimal; a comparison that raises, as sNaN does, fails the test).
The comparison is restated here from that file's documented behaviour in
Python's own decimal module (not copied); tests/test_code.c checks
qd_code_stdout_equal against every line.

Command (Python 3, standard library only):
    python3 tests/ref/lcb_compare_cases.py
"""
import json
from decimal import Decimal
from itertools import product

OUT = "tests/fixtures/code/compare_cases.jsonl"
OUT_JSON = "tests/fixtures/code/json_equal_cases.jsonl"

VALUES = ["0", "1", "-1", "1.0", "0.0", "-0.0", "2", "2.0", "2.5", "true", "false", "null", "\"1\"",
          "\"\"", "\"a\"", "[]", "[1]", "[1.0]", "[true]", "[1, 2]", "[2, 1]", "[[1, 2]]", "[[1.0, 2]]",
          "{}", "{\"a\": 1}", "{\"a\": 1.0}", "{\"a\": true}", "{\"b\": 1}", "{\"a\": 1, \"b\": 2}",
          "{\"b\": 2, \"a\": 1}", "0.1", "0.30000000000000004", "0.3", "1e3", "1000",
          "9007199254740993", "9007199254740992.0", "[null]", "[[]]", "\"\\u00e9\"", "\"\u00e9\""]


def stripped_lines(s):
    return [line.strip() for line in s.strip().split("\n")]


def lcb_equal(got, expected):
    a, b = stripped_lines(got), stripped_lines(expected)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x == y:
            continue
        try:
            dx = [Decimal(t) for t in x.split()]
            dy = [Decimal(t) for t in y.split()]
            if dx != dy:
                return False
        except Exception:
            return False
    return True


# ASCII tokens only: Python's Decimal also takes other Unicode digits, which
# the C grader does not (docs/sandbox.md).
TOKENS = ["0", "-0", "+0", "0.000", "0e5", "1", "01", "1.0", "1.", ".5", "0.5", "5e-1", "1e2",
          "1E+02", "100", "1e", "e1", "1.2.3", "1_000", "1__000", "_1", "1_", "_", "in_f", "1e_5", "-_1", "1000", "10e2",
          "12345678901234567890", "12345678901234567890.0", "12345678901234567891",
          "0.333333", "0.3333333", "inf", "Infinity", "-inf", "-Infinity", "nan", "NaN",
          "NaN12", "sNaN", "0x10", "16", "yes", "YES", "-", "+", "1e-999999", "0e-999999",
          "3.14", "3.140", "314e-2", "2", "2.5"]

LINES = ["", "1 2", "1  2", "1 2 ", " 1 2", "1\t2", "1 2\n", "1 2\n\n\n", "1\n\n2", "1\n2",
         "1\r\n2\r\n", "1 2 3", "a b", "A b", "1.0 2.0", "1e0 2e0", "2 1"]


def main():
    cases = []
    for a, b in product(TOKENS, TOKENS):
        cases.append((a, b))
    for a, b in product(LINES, LINES):
        cases.append((a, b))
    with open(OUT, "w") as f:
        for a, b in cases:
            f.write(json.dumps({"got": a, "expected": b, "equal": lcb_equal(a, b)}) + "\n")
    print(f"{OUT}: {len(cases)} cases, {sum(lcb_equal(a, b) for a, b in cases)} equal")
    n = eq = 0
    with open(OUT_JSON, "w") as f:
        for a, b in product(VALUES, VALUES):
            e = json.loads(a) == json.loads(b)
            f.write(json.dumps({"a": a, "b": b, "equal": e}) + "\n")
            n, eq = n + 1, eq + e
    print(f"{OUT_JSON}: {n} cases, {eq} equal")


if __name__ == "__main__":
    main()
