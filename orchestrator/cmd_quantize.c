/* quads quantize: a Hugging Face safetensors checkpoint to NVFP4 or FP8 in
 * NVIDIA ModelOpt's layout (docs/numerics.md §2), with an optional error
 * report per tensor. The numbers come from quant/ (the one quantize function
 * the rollout and the trainer share); this file only selects tensors, lays
 * out the output and writes the files. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "config.h"
#include "models/safetensors.h"
#include "orchestrator/commands.h"
#include "quant/fileio.h"
#include "quant/quant.h"

#define WORST_BLOCKS 8   /* worst 16-element blocks kept per tensor in the report */
#define PRINT_BLOCKS 3   /* of which printed on stdout */

typedef enum { FMT_NVFP4, FMT_FP8 } qformat;

typedef struct {
    const char *in, *out;
    qformat format;
    int all, report;
} options;

static void usage(FILE *f)
{
    fprintf(f,
"usage: quads quantize --in PATH --out DIR [--format nvfp4|fp8] [--all] [--report]\n"
"\n"
"Quantizes the linear-layer weights of a safetensors checkpoint; every other\n"
"tensor is copied unchanged. PATH is a .safetensors file, a sharded\n"
"model.safetensors.index.json, or a directory holding either. Weights are read\n"
"as F32, BF16 or F16.\n"
"\n"
"Which tensors:\n"
"  default  2-D NAME.weight of the linear layers a model quantizes: attention\n"
"           q_proj, k_proj, v_proj, o_proj and MLP/expert gate_proj, up_proj,\n"
"           down_proj (also Mixtral's experts.N.w1/w2/w3). Kept as they are:\n"
"           embeddings, the router (mlp.gate), norms, lm_head. For nvfp4 their\n"
"           last dimension K must be a multiple of 16 (else an error).\n"
"  --all    every 2-D NAME.weight in F32/BF16/F16 (for nvfp4: with K a multiple\n"
"           of 16; the others are copied).\n"
"\n"
"Output (DIR is created if needed; files are replaced atomically):\n"
"  DIR/model.safetensors, ModelOpt layout, for a weight W of shape [N, K]:\n"
"    nvfp4  NAME.weight          U8      [N, K/2]   two E2M1 codes a byte, element\n"
"                                                   2i in the low nibble\n"
"           NAME.weight_scale    F8_E4M3 [N, K/16]  block scales (16 elements along K)\n"
"           NAME.weight_scale_2  F32     []         global decode scale (amax/2688)\n"
"           W ~ e2m1(code) * weight_scale * weight_scale_2\n"
"    fp8    NAME.weight          F8_E4M3 [N, K]\n"
"           NAME.weight_scale    F32     [N]        per-row decode scale (amax_row/448)\n"
"           W ~ e4m3(weight) * weight_scale\n"
"  DIR/hf_quant_config.json   {\"producer\": {\"name\": \"quads\", ...}, \"quantization\":\n"
"           {\"quant_algo\": \"NVFP4\" (group_size 16) or \"FP8_PER_CHANNEL_PER_TOKEN\",\n"
"            \"exclude_modules\": [2-D weights left unquantized]}}\n"
"           Activations are quantized at run time (per token), so there is no\n"
"           input_scale.\n"
"\n"
"Options:\n"
"  --in PATH        input checkpoint (required)\n"
"  --out DIR        output directory (required)\n"
"  --format F       nvfp4 (default) or fp8\n"
"  --all            quantize every eligible 2-D *.weight (see above)\n"
"  --report         print, per quantized tensor, the relative error\n"
"                   ||W - deq(q(W))|| / ||W|| and its worst 16-element blocks\n"
"                   (row, block along K, absolute and relative L2 error), and\n"
"                   write them to DIR/quant_report.json\n"
"  -h, --help       this text\n");
}

static int parse_args(options *o, int argc, char **argv)
{
    static const struct option longopts[] = {
        {"in", required_argument, NULL, 'i'},   {"out", required_argument, NULL, 'o'},
        {"format", required_argument, NULL, 'f'}, {"all", no_argument, NULL, 'a'},
        {"report", no_argument, NULL, 'r'},     {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    memset(o, 0, sizeof *o);
    opterr = 0;
    optind = 1;
    for (int c; (c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1;) {
        switch (c) {
        case 'i': o->in = optarg; break;
        case 'o': o->out = optarg; break;
        case 'a': o->all = 1; break;
        case 'r': o->report = 1; break;
        case 'h': usage(stdout); return 0;
        case 'f':
            if (!strcmp(optarg, "nvfp4")) {
                o->format = FMT_NVFP4;
            } else if (!strcmp(optarg, "fp8")) {
                o->format = FMT_FP8;
            } else {
                fprintf(stderr, "quads quantize: --format: unknown format '%s' (nvfp4 or fp8)\n",
                        optarg);
                return 2;
            }
            break;
        case ':':
            fprintf(stderr, "quads quantize: option '%s' needs a value\n", argv[optind - 1]);
            return 2;
        default:
            fprintf(stderr, "quads quantize: unknown option '%s' (see --help)\n", argv[optind - 1]);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "quads quantize: unexpected argument '%s' (see --help)\n", argv[optind]);
        return 2;
    }
    if (!o->in || !o->out) {
        fprintf(stderr, "quads quantize: --in and --out are required (see --help)\n");
        return 2;
    }
    return -1;
}

/* ---- which tensors */

/* The module a linear layer's weight belongs to: "NAME.weight" -> its last
 * component before ".weight" (e.g. "q_proj"), copied into buf. */
static const char *module_leaf(char *buf, size_t len, const char *name)
{
    size_t n = strlen(name) - strlen(".weight");
    const char *start = name;
    for (const char *p = name; p < name + n; p++)
        if (*p == '.')
            start = p + 1;
    snprintf(buf, len, "%.*s", (int)(name + n - start), start);
    return buf;
}

/* ARCHITECTURE.md: attention q/k/v/o and MLP/expert gate/up/down are quantized;
 * embeddings, the router (mlp.gate), norms and lm_head stay as they are. */
static int is_model_linear(const char *name)
{
    static const char *const leaves[] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                         "gate_proj", "up_proj", "down_proj"};
    char leaf[256];
    module_leaf(leaf, sizeof leaf, name);
    for (size_t i = 0; i < sizeof leaves / sizeof leaves[0]; i++)
        if (!strcmp(leaf, leaves[i]))
            return 1;
    return strstr(name, ".experts.") && (!strcmp(leaf, "w1") || !strcmp(leaf, "w2") ||
                                         !strcmp(leaf, "w3"));
}

static int is_float(qd_st_dtype dt)
{
    return dt == QD_ST_F32 || dt == QD_ST_BF16 || dt == QD_ST_F16;
}

/* 1: quantize; 0: copy; -1: an error (message printed). */
static int select_tensor(const options *o, const qd_st_tensor *t)
{
    if (!qd_str_ends_with(t->name, ".weight") || t->ndim != 2 || !t->numel)
        return 0;
    int k_ok = o->format == FMT_FP8 || t->shape[1] % QD_NVFP4_BLOCK == 0;
    if (o->all)
        return is_float(t->dtype) && k_ok;
    if (!is_model_linear(t->name))
        return 0;
    if (!is_float(t->dtype)) {
        fprintf(stderr, "quads quantize: %s: tensor '%s': field 'dtype' is %s; a linear "
                "weight to quantize must be F32, BF16 or F16\n", t->file, t->name,
                qd_st_dtype_name(t->dtype));
        return -1;
    }
    if (!k_ok) {
        fprintf(stderr, "quads quantize: %s: tensor '%s': field 'shape' [%lld, %lld]: K = %lld "
                "is not a multiple of 16, NVFP4's block size\n", t->file, t->name,
                (long long)t->shape[0], (long long)t->shape[1], (long long)t->shape[1]);
        return -1;
    }
    return 1;
}

/* ---- the error report */

typedef struct {
    int64_t row, block;
    double abs_err, rel_err;
} block_err;

/* Keeps the WORST_BLOCKS largest absolute errors in w (sorted, largest first). */
static void keep_worst(block_err *w, int *n, block_err b)
{
    int i = *n < WORST_BLOCKS ? (*n)++ : WORST_BLOCKS;
    if (i == WORST_BLOCKS && b.abs_err <= w[WORST_BLOCKS - 1].abs_err)
        return;
    if (i == WORST_BLOCKS)
        i = WORST_BLOCKS - 1;
    for (; i > 0 && w[i - 1].abs_err < b.abs_err; i--)
        w[i] = w[i - 1];
    w[i] = b;
}

/* Errors of x_hat against x (N, K) in double: the tensor's relative L2 error
 * and its worst 16-element blocks along K. */
static json_t *error_report(const char *name, const float *x, const float *xh, int64_t N,
                            int64_t K, double *num, double *den)
{
    block_err worst[WORST_BLOCKS];
    int nw = 0;
    double tn = 0, td = 0;
    for (int64_t r = 0; r < N; r++)
        for (int64_t b = 0; b * QD_NVFP4_BLOCK < K; b++) {
            double e = 0, s = 0;
            for (int64_t i = b * QD_NVFP4_BLOCK; i < K && i < (b + 1) * QD_NVFP4_BLOCK; i++) {
                double d = (double)x[r * K + i] - (double)xh[r * K + i];
                e += d * d;
                s += (double)x[r * K + i] * (double)x[r * K + i];
            }
            tn += e;
            td += s;
            keep_worst(worst, &nw, (block_err){r, b, sqrt(e), s > 0 ? sqrt(e / s) : 0});
        }
    *num += tn;
    *den += td;
    json_t *blocks = json_array();
    for (int i = 0; i < nw; i++)
        json_array_append_new(blocks, json_pack("{s:I, s:I, s:f, s:f}", "row", (json_int_t)worst[i].row,
                              "block", (json_int_t)worst[i].block, "abs_error", worst[i].abs_err,
                              "rel_error", worst[i].rel_err));
    return json_pack("{s:s, s:[I, I], s:f, s:o}", "name", name, "shape", (json_int_t)N,
                     (json_int_t)K, "rel_error", td > 0 ? sqrt(tn / td) : 0.0,
                     "worst_blocks", blocks);
}

static void print_report_line(const json_t *r)
{
    json_t *sh = json_object_get(r, "shape");
    printf("%-52s [%5lld, %5lld]  rel_error %.6f  worst blocks (row,block: abs rel):",
           json_string_value(json_object_get(r, "name")),
           (long long)json_integer_value(json_array_get(sh, 0)),
           (long long)json_integer_value(json_array_get(sh, 1)),
           json_real_value(json_object_get(r, "rel_error")));
    json_t *b = json_object_get(r, "worst_blocks");
    for (size_t i = 0; i < json_array_size(b) && i < PRINT_BLOCKS; i++) {
        json_t *e = json_array_get(b, i);
        printf(" (%lld,%lld: %.3g %.3g)", (long long)json_integer_value(json_object_get(e, "row")),
               (long long)json_integer_value(json_object_get(e, "block")),
               json_real_value(json_object_get(e, "abs_error")),
               json_real_value(json_object_get(e, "rel_error")));
    }
    printf("\n");
}

/* ---- quantizing one tensor into the writer */

typedef struct {
    qd_safetensors_writer *w;
    json_t *report;         /* array of per-tensor reports, or NULL */
    json_t *excluded;       /* module names of 2-D weights left as they are */
    double err_num, err_den;
    int nquant;
} run_state;

static char *suffixed(const char *name, const char *suffix)
{
    size_t len = strlen(name) + strlen(suffix) + 1;
    char *s = malloc(len);
    if (s)
        snprintf(s, len, "%s%s", name, suffix);
    return s;
}

static qd_status add_copy(run_state *rs, const char *name, const char *suffix, qd_st_dtype dt,
                          int ndim, const int64_t *shape, const void *src, size_t nbytes)
{
    void *data = malloc(nbytes ? nbytes : 1);
    char *full = suffixed(name, suffix);
    if (!data || !full) {
        free(data);
        free(full);
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", name);
    }
    memcpy(data, src, nbytes);
    qd_status st = qd_safetensors_writer_add_steal(rs->w, full, dt, ndim, shape, data);
    free(full);
    return st;
}

/* NVFP4: codes, block scales and the global decode scale; xh = dequant. */
static qd_status quantize_nvfp4(run_state *rs, const char *base, const float *x, float *xh,
                                int64_t N, int64_t K)
{
    qd_nvfp4 q;
    qd_status st = qd_nvfp4_alloc(&q, N, K, QD_SCALE_PER_TENSOR);
    if (st != QD_OK)
        return st;
    st = qd_nvfp4_quantize(&q, x);
    if (st == QD_OK)
        st = add_copy(rs, base, ".weight", QD_ST_U8, 2, (int64_t[]){N, K / 2}, q.codes,
                      (size_t)(N * K / 2));
    if (st == QD_OK)
        st = add_copy(rs, base, ".weight_scale", QD_ST_F8_E4M3, 2,
                      (int64_t[]){N, K / QD_NVFP4_BLOCK}, q.scales, (size_t)(N * K / QD_NVFP4_BLOCK));
    if (st == QD_OK)
        st = add_copy(rs, base, ".weight_scale_2", QD_ST_F32, 0, NULL, q.s_dec, sizeof(float));
    if (st == QD_OK && xh)
        qd_nvfp4_dequantize(xh, &q);
    qd_nvfp4_free(&q);
    return st;
}

/* FP8: E4M3 codes and one decode scale per row; xh = dequant. */
static qd_status quantize_fp8(run_state *rs, const char *base, const float *x, float *xh,
                              int64_t N, int64_t K)
{
    uint8_t *q = malloc((size_t)(N * K));
    float *sinv = malloc((size_t)N * sizeof *sinv);
    qd_status st = q && sinv ? qd_fp8_quantize_rows(q, sinv, x, N, K)
                             : qd_error(QD_ERR_NOMEM, "%s: out of memory", base);
    if (st == QD_OK)
        st = add_copy(rs, base, ".weight", QD_ST_F8_E4M3, 2, (int64_t[]){N, K}, q, (size_t)(N * K));
    if (st == QD_OK)
        st = add_copy(rs, base, ".weight_scale", QD_ST_F32, 1, (int64_t[]){N}, sinv,
                      (size_t)N * sizeof *sinv);
    if (st == QD_OK && xh)
        qd_fp8_dequantize_rows(xh, q, sinv, N, K);
    free(q);
    free(sinv);
    return st;
}

static qd_status quantize_tensor(run_state *rs, const options *o, const qd_st_tensor *t)
{
    int64_t N = t->shape[0], K = t->shape[1];
    size_t base_len = strlen(t->name) - strlen(".weight");
    char *base = malloc(base_len + 1);
    float *x = malloc((size_t)t->numel * sizeof *x);
    float *xh = rs->report ? malloc((size_t)t->numel * sizeof *xh) : NULL;
    qd_status st = QD_OK;
    if (!base || !x || (rs->report && !xh))
        st = qd_error(QD_ERR_NOMEM, "%s: tensor '%s': out of memory", t->file, t->name);
    if (st == QD_OK) {
        snprintf(base, base_len + 1, "%s", t->name);
        st = qd_safetensors_to_f32(x, t);
    }
    if (st == QD_OK)
        st = o->format == FMT_NVFP4 ? quantize_nvfp4(rs, base, x, xh, N, K)
                                    : quantize_fp8(rs, base, x, xh, N, K);
    if (st != QD_OK && st != QD_ERR_NOMEM) {
        char why[512];   /* qd_error overwrites the message it would quote */
        snprintf(why, sizeof why, "%s", qd_last_error());
        st = qd_error(st, "%s: tensor '%s': %s", t->file, t->name, why);
    }
    if (st == QD_OK && rs->report)
        json_array_append_new(rs->report, error_report(t->name, x, xh, N, K, &rs->err_num,
                                                       &rs->err_den));
    rs->nquant += st == QD_OK;
    free(base);
    free(x);
    free(xh);
    return st;
}

/* ---- the output files */

static qd_status fill_json(FILE *f, const char *path, void *ctx)
{
    if (json_dumpf((const json_t *)ctx, f, JSON_INDENT(2) | JSON_SORT_KEYS) != 0 ||
        fputc('\n', f) == EOF)
        return qd_error(QD_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return QD_OK;
}

static json_t *quant_config(const options *o, json_t *excluded)
{
    json_t *q = json_pack("{s:s, s:n, s:O}", "quant_algo",
                          o->format == FMT_NVFP4 ? "NVFP4" : "FP8_PER_CHANNEL_PER_TOKEN",
                          "kv_cache_quant_algo", "exclude_modules", excluded);
    if (o->format == FMT_NVFP4)
        json_object_set_new(q, "group_size", json_integer(QD_NVFP4_BLOCK));
    return json_pack("{s:{s:s, s:s}, s:o}", "producer", "name", "quads", "version",
                     PACKAGE_VERSION, "quantization", q);
}

static qd_status write_json(const char *dir, const char *file, json_t *j)
{
    size_t len = strlen(dir) + strlen(file) + 2;
    char *path = malloc(len);
    if (!path || !j) {
        free(path);
        return qd_error(QD_ERR_NOMEM, "%s/%s: out of memory", dir, file);
    }
    snprintf(path, len, "%s/%s", dir, file);
    qd_status st = qd_atomic_write_with(path, fill_json, j);
    free(path);
    return st;
}

/* Every tensor goes to the writer: quantized, or borrowed from the input's mmap. */
static int convert_all(run_state *rs, const options *o, const qd_safetensors *in)
{
    for (size_t i = 0; i < qd_safetensors_count(in); i++) {
        const qd_st_tensor *t = qd_safetensors_at(in, i);
        int sel = select_tensor(o, t);
        if (sel < 0)
            return 1;
        qd_status st = sel ? quantize_tensor(rs, o, t)
                           : qd_safetensors_writer_add(rs->w, t->name, t->dtype, t->ndim,
                                                       t->shape, t->data);
        if (st != QD_OK) {
            fprintf(stderr, "quads quantize: %s\n", qd_last_error());
            return 1;
        }
        if (!sel && t->ndim == 2 && qd_str_ends_with(t->name, ".weight"))
            json_array_append_new(rs->excluded, json_stringn(t->name, strlen(t->name) - 7));
    }
    return 0;
}

static void copy_metadata(qd_safetensors_writer *w, const qd_safetensors *in)
{
    for (size_t i = 0; i < qd_safetensors_metadata_count(in); i++)
        qd_safetensors_writer_set_metadata(w, qd_safetensors_metadata_key(in, i),
                                           qd_safetensors_metadata_value(in, i));
    if (!qd_safetensors_metadata_get(in, "format"))   /* transformers wants "pt" */
        qd_safetensors_writer_set_metadata(w, "format", "pt");
}

static qd_status write_outputs(run_state *rs, const options *o)
{
    size_t len = strlen(o->out) + 32;
    char *path = malloc(len);
    if (!path)
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", o->out);
    snprintf(path, len, "%s/model.safetensors", o->out);
    qd_status st = qd_safetensors_writer_write(rs->w, path);
    free(path);
    if (st == QD_OK) {
        json_t *cfg = quant_config(o, rs->excluded);
        st = write_json(o->out, "hf_quant_config.json", cfg);
        json_decref(cfg);
    }
    if (st == QD_OK && rs->report) {
        double rel = rs->err_den > 0 ? sqrt(rs->err_num / rs->err_den) : 0.0;
        json_t *rep = json_pack("{s:s, s:s, s:f, s:O}", "format",
                                o->format == FMT_NVFP4 ? "nvfp4" : "fp8", "input", o->in,
                                "overall_rel_error", rel, "tensors", rs->report);
        st = write_json(o->out, "quant_report.json", rep);
        json_decref(rep);
    }
    return st;
}

static void print_summary(const run_state *rs, const options *o)
{
    if (rs->report) {
        for (size_t i = 0; i < json_array_size(rs->report); i++)
            print_report_line(json_array_get(rs->report, i));
        printf("overall rel_error %.6f over %d tensors; report in %s/quant_report.json\n",
               rs->err_den > 0 ? sqrt(rs->err_num / rs->err_den) : 0.0, rs->nquant, o->out);
    }
    printf("quantized %d tensors to %s, kept %zu 2-D weights; wrote %s/model.safetensors and "
           "%s/hf_quant_config.json\n", rs->nquant, o->format == FMT_NVFP4 ? "NVFP4" : "FP8",
           json_array_size(rs->excluded), o->out, o->out);
}

int qd_cmd_quantize(int argc, char **argv)
{
    options o;
    int rc = parse_args(&o, argc, argv);
    if (rc >= 0)
        return rc;
    qd_safetensors *in = NULL;
    run_state rs = {.report = o.report ? json_array() : NULL, .excluded = json_array()};
    qd_status st = qd_safetensors_open(&in, o.in);
    if (st == QD_OK && qd_safetensors_count(in) == 0) /* valid safetensors, but no model */
        st = qd_error(QD_ERR_FORMAT, "%s: field 'header': no tensors", o.in);
    if (st == QD_OK)
        st = qd_mkdirs(o.out);
    if (st == QD_OK)
        st = qd_safetensors_writer_new(&rs.w);
    rc = st != QD_OK;
    if (rc)
        fprintf(stderr, "quads quantize: %s\n", qd_last_error());
    if (!rc) {
        copy_metadata(rs.w, in);
        rc = convert_all(&rs, &o, in);
    }
    if (!rc && (st = write_outputs(&rs, &o)) != QD_OK) {
        fprintf(stderr, "quads quantize: %s\n", qd_last_error());
        rc = 1;
    }
    if (!rc)
        print_summary(&rs, &o);
    qd_safetensors_writer_free(rs.w);
    qd_safetensors_close(in);
    json_decref(rs.report);
    json_decref(rs.excluded);
    return rc;
}
