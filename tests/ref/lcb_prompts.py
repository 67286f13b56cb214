"""LiveCodeBench's own prompts for two real problems, to check qd_lcb_prompt.

Writes tests/fixtures/code/lcb_prompts.json: {"system": the system
message of LiveCodeBench's chat styles, "prompts": {question_id: prompt}} for
1873_A (stdin/stdout, no starter code) and 2819 (LeetCode, starter code) of
tests/fixtures/benchmarks/livecodebench_release_v1_nopriv_mavencoder.jsonl, as
LiveCodeBench's get_generic_question_template_answer builds them. The
function is LiveCodeBench's, imported from a checkout (nothing of it is
copied here); its module imports the `datasets` package at the top, which a
stub stands in for (only load_dataset is named, never called).

Command (Python 3, standard library only), with a checkout of
LiveCodeBench/LiveCodeBench (28fef95ea8c9f7a547c8329f2cd3d32b92c1fa24 gave the fixture):
    python3 tests/ref/lcb_prompts.py PATH/TO/LiveCodeBench
"""
import importlib.util
import json
import os
import sys
import types

ROWS = "tests/fixtures/benchmarks/livecodebench_release_v1_nopriv_mavencoder.jsonl"
OUT = "tests/fixtures/code/lcb_prompts.json"
IDS = ["1873_A", "2819"]


def main(lcb):
    here = os.getcwd()
    sys.modules["datasets"] = types.SimpleNamespace(load_dataset=None)
    sys.path.insert(0, lcb)
    os.chdir(lcb)  # the module reads its few-shot examples by a relative path
    spec = importlib.util.spec_from_file_location("lcb_codegen_prompts",
                                                  os.path.join(lcb, "lcb_runner/prompts/code_generation.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    os.chdir(here)
    from lcb_runner.benchmarks.code_generation import CodeGenerationProblem
    rows = {}
    with open(ROWS) as f:
        for line in f:
            r = json.loads(line)
            rows[r["question_id"]] = r
    prompts = {}
    for qid in IDS:
        r = dict(rows[qid])
        r.setdefault("private_test_cases", "[]")
        prompts[qid] = mod.get_generic_question_template_answer(CodeGenerationProblem(**r))
    with open(OUT, "w") as f:
        json.dump({"system": mod.PromptConstants.SYSTEM_MESSAGE_GENERIC, "prompts": prompts}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
