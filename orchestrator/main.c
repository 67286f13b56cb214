/* quads: the command-line entry point. Dispatches to one subcommand. */
#include <stdio.h>
#include <string.h>
#include "config.h"
#include "orchestrator/commands.h"

static const qd_command commands[] = {
    {"quantize", qd_cmd_quantize, "quantize a safetensors file to NVFP4 or FP8 (ModelOpt layout)"},
    {"tokenize", qd_cmd_tokenize, "text to token ids (and back) with a tokenizer.json"},
    {"forward", qd_cmd_forward, "log-probs and logits of token ids under a checkpoint, in any precision recipe"},
    {"generate", qd_cmd_generate, "sample completions of a prompt from a checkpoint"},
    {"grade", qd_cmd_grade, "grade model outputs against gold answers (JSONL in, JSONL out)"},
    {"bench", qd_cmd_bench, "list and fetch benchmark datasets"},
    {"eval", qd_cmd_eval, "grade a model on benchmarks: pass@k, maj@k, report.md and report.json"},
    {"sft", qd_cmd_sft, "train a model on the synthetic task with cross-entropy (makes the tiny model)"},
    {"rl", qd_cmd_rl, "reinforcement learning (GRPO) with NVFP4 rollouts: the main job"},
    {"compare", qd_cmd_compare, "run one config once per precision recipe and write report.md with plots"},
    {"report", qd_cmd_report, "report.md and plots from existing runs"},
    {"ablate", qd_cmd_ablate, "per layer, the rollout gap with only activations vs only weights in NVFP4"},
    {NULL, NULL, NULL},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: quads COMMAND [OPTIONS]\n\n"
               "QUADS-C: reinforcement learning of MoE language models with NVFP4 rollouts.\n\n"
               "commands:\n");
    for (const qd_command *c = commands; c->name; c++)
        fprintf(f, "  %-12s %s\n", c->name, c->summary);
    fprintf(f, "\nRun 'quads COMMAND --help' for a command's options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("quads %s\n", PACKAGE_VERSION);
        return 0;
    }
    for (const qd_command *c = commands; c->name; c++)
        if (!strcmp(argv[1], c->name))
            return c->run(argc - 1, argv + 1);
    fprintf(stderr, "quads: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
