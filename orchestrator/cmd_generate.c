/* quads generate: sample completions of one prompt from a Hugging Face
 * checkpoint with its tokenizer.json (orchestrator/generation.h). Sample i
 * uses sampling stream (sequence id) i, so sample 0 of --samples K equals the
 * single sample of --samples 1 with the same seed (NUMERICS.md §6), and
 * sample i*K + k equals sample k of problem i in quads eval --samples K. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "orchestrator/commands.h"
#include "orchestrator/generation.h"

typedef struct {
    const char *prompt, *mode;
    int json, samples;
    qd_generation_opts gen;
} generate_opts;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: quads generate --model DIR --prompt TEXT [OPTIONS]\n\n"
            "Samples completions of the prompt and prints them (one JSON line each with --json).\n"
            "Generation stops at the tokenizer's <|im_end|> and <|endoftext|>, at the eos_token\n"
            "of tokenizer_config.json (beside the tokenizer) and the eos_token_id of\n"
            "DIR/generation_config.json, or after --max-tokens.\n\n"
            "  --model DIR           Hugging Face folder (config.json, model.safetensors)\n"
            "  --prompt TEXT         the prompt (with --chat: the user message)\n"
            "  --chat                format as a ChatML conversation with the generation prompt\n"
            "  --system TEXT         with --chat, a system message first\n"
            "  --tokenizer FILE      tokenizer.json (default DIR/tokenizer.json)\n"
            "  --precision P         fp32 (default), bf16, fp8, nvfp4, nvfp4-aqat, nvfp4-rac,\n"
            "                        quads, nvfp4-sym-qat, nvfp4-replay, quads-replay (the rollout side)\n"
            "  --rac-ratio R         fraction of channels RAC compensates (default 0.1)\n"
            "  --seed N              sampling seed (default 0)\n"
            "  --temperature T       default 1; 0 is greedy\n"
            "  --top-k K             keep the K most likely tokens (default 0: off)\n"
            "  --top-p P             nucleus sampling, P in (0, 1] (default 1: off)\n"
            "  --max-tokens N        new tokens at most (default 64)\n"
            "  --samples K           completions, sampling streams 0 .. K-1 (default 1)\n"
            "  --backend B           auto (default: CUDA if present, else the CPU), cpu or cuda\n"
            "  --mode M              exact (default: the CPU's bits) or fast (CUDA only)\n"
            "  --threads N           OpenMP threads (default: the runtime's)\n"
            "  --json                one JSON line per sample: tokens, text, sum_logprob, finish\n");
}

static int fail(int rc, const char *msg)
{
    fprintf(stderr, "quads generate: %s\n", msg);
    return rc;
}

/* A number in [lo, hi] from the whole of s (integral when integer). */
static int parse_num(const char *s, double lo, double hi, int integer, double *out)
{
    return qd_cli_real(s, lo, hi, out) && (!integer || *out == floor(*out));
}

static int set_option(generate_opts *o, int c, const char *arg)
{
    double x = 0;
    int ok = 1;
    switch (c) {
    case 'm': o->gen.model = arg; break;
    case 'p': o->prompt = arg; break;
    case 'c': o->gen.chat = 1; break;
    case 'y': o->gen.system = arg; break;
    case 'k': o->gen.tokenizer = arg; break;
    case 'j': o->json = 1; break;
    case 'b': o->gen.backend = arg; break;
    case 'O': o->mode = arg; break;
    case 'P':
        if (qd_recipe_parse(&o->gen.opt.recipe, arg))
            return fail(2, qd_last_error());
        break;
    case 'a': ok = parse_num(arg, 0, 1, 0, &o->gen.opt.rac_ratio); break;
    case 's': ok = qd_cli_uint(arg, UINT64_MAX, &o->gen.seed); break;
    case 'T': ok = parse_num(arg, 0, 1e6, 0, &o->gen.temperature); break;
    case 'K': ok = parse_num(arg, 0, 1 << 30, 1, &x); o->gen.top_k = (int)x; break;
    case 'N': ok = parse_num(arg, 1e-9, 1, 0, &o->gen.top_p); break;
    case 'M': ok = parse_num(arg, 1, 1 << 20, 1, &x); o->gen.max_tokens = (int)x; break;
    case 'S': ok = parse_num(arg, 1, 4096, 1, &x); o->samples = (int)x; break;
    case 't': ok = parse_num(arg, 1, 4096, 1, &x); o->gen.opt.num_threads = (int)x; break;
    default: usage(stderr); return 2;
    }
    if (!ok) {
        fprintf(stderr, "quads generate: bad value '%s' (see --help for the range)\n", arg);
        return 2;
    }
    return -1;
}

static int parse_args(int argc, char **argv, generate_opts *o)
{
    static const struct option longs[] = {
        {"model", required_argument, 0, 'm'},       {"prompt", required_argument, 0, 'p'},
        {"chat", no_argument, 0, 'c'},              {"system", required_argument, 0, 'y'},
        {"tokenizer", required_argument, 0, 'k'},   {"precision", required_argument, 0, 'P'},
        {"rac-ratio", required_argument, 0, 'a'},   {"seed", required_argument, 0, 's'},
        {"temperature", required_argument, 0, 'T'}, {"top-k", required_argument, 0, 'K'},
        {"top-p", required_argument, 0, 'N'},       {"max-tokens", required_argument, 0, 'M'},
        {"samples", required_argument, 0, 'S'},     {"backend", required_argument, 0, 'b'},
        {"threads", required_argument, 0, 't'},     {"json", no_argument, 0, 'j'},
        {"mode", required_argument, 0, 'O'},        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int c, rc;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return 0;
        }
        if ((rc = set_option(o, c, optarg)) >= 0)
            return rc;
    }
    if (!o->gen.model || !o->prompt || optind != argc) {
        usage(stderr);
        return 2;
    }
    return qd_cli_backend_mode(o->gen.backend, o->mode, &o->gen.opt.mode) ? fail(2, qd_last_error()) : -1;
}

/* ---- generating */

static qd_status print_sample(const generate_opts *o, int i, const qd_generation_sample *s)
{
    int bad;
    if (o->json) {
        json_t *jt = json_array();
        double sum = 0;
        for (int t = 0; t < s->n; t++) {
            json_array_append_new(jt, json_integer(s->tokens[t]));
            sum += s->logp[t];
        }
        json_t *out = json_pack("{s:i,s:o,s:s,s:f,s:s}", "sample", i, "tokens", jt, "text", s->text,
                                "sum_logprob", sum, "finish", s->stopped ? "stop" : "length");
        bad = !out || json_dumpf(out, stdout, JSON_REAL_PRECISION(9) | JSON_COMPACT) || putchar('\n') == EOF;
        json_decref(out);
    } else {
        if (o->samples > 1)
            printf("--- sample %d\n", i);
        bad = printf("%s\n", s->text) < 0;
    }
    return bad ? qd_error(QD_ERR_IO, "stdout: write failed") : QD_OK;
}

/* The one prompt has index 0: sample i is sampling stream i (generation.h). */
static int run(generate_opts *o)
{
    qd_generation *g = NULL;
    qd_generation_sample *s = calloc((size_t)o->samples, sizeof *s);
    qd_status st = s ? qd_generation_open(&o->gen, &g) : qd_error(QD_ERR_NOMEM, "out of memory");
    if (!st)
        st = qd_generation_run(g, &o->prompt, 1, o->samples, 0, s);
    for (int i = 0; !st && i < o->samples; i++)
        st = print_sample(o, i, &s[i]);
    if (!st && fflush(stdout))
        st = qd_error(QD_ERR_IO, "stdout: write failed");
    int rc = st ? fail(1, qd_last_error()) : 0;
    if (s)
        qd_generation_samples_free(s, (size_t)o->samples);
    free(s);
    qd_generation_free(g);
    return rc;
}

int qd_cmd_generate(int argc, char **argv)
{
    generate_opts o = {.samples = 1};
    qd_generation_opts_default(&o.gen);
    int rc = parse_args(argc, argv, &o);
    return rc >= 0 ? rc : run(&o);
}
