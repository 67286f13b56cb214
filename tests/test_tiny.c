/* Suite "tiny": the synthetic task's format and reward, the generated
 * tokenizer, `quads sft`'s determinism, and the shipped tiny model. */
#include <stdlib.h>
#include <string.h>
#include "tests/suites.h"
#include "orchestrator/task.h"
#include "orchestrator/sft.h"

static qd_tokenizer *tiny_tokenizer(void)
{
    char *json;
    size_t len;
    qd_tokenizer *tok;
    ck_assert_int_eq(qd_sft_tokenizer_json(&json, &len), QD_OK);
    ck_assert_int_eq(qd_tokenizer_load_string(json, len, "tiny tokenizer.json", &tok), QD_OK);
    free(json);
    return tok;
}

/* ids of text (n of them) */
static int32_t *encode(const qd_tokenizer *tok, const char *text, size_t *n)
{
    int32_t *ids;
    ck_assert_int_eq(qd_tokenizer_encode(tok, text, strlen(text), &ids, n), QD_OK);
    return ids;
}

START_TEST(test_task_prompt_format)
{
    char *p;
    ck_assert_int_eq(qd_task_prompt_text("What is 35 + 79?", &p), QD_OK);
    ck_assert_str_eq(p, "Q: What is 35 + 79?\nA: ");
    free(p);
}
END_TEST

START_TEST(test_task_parse)
{
    qd_synth_opts o = {.seed = 7};
    ck_assert_int_eq(qd_task_parse("arith", &o), QD_OK);
    ck_assert_int_eq(o.steps, QD_TASK_DEFAULT_STEPS);
    ck_assert_int_eq(o.max_operand, QD_TASK_DEFAULT_MAX_OPERAND);
    ck_assert_int_eq(qd_task_parse("arith3:50", &o), QD_OK);
    ck_assert_int_eq(o.steps, 3);
    ck_assert_int_eq(o.max_operand, 50);
    ck_assert_int_eq(o.seed, 7);
    ck_assert_int_eq(qd_task_parse("arith5", &o), QD_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "arith5"));
    ck_assert_int_eq(qd_task_parse("arith1:0", &o), QD_ERR_ARG);
    ck_assert_int_eq(qd_task_parse("arith1:", &o), QD_ERR_ARG);
    ck_assert_int_eq(qd_task_parse("gsm8k", &o), QD_ERR_ARG);
}
END_TEST

/* Prompt ids are the ids of the prompt text; the target adds the answer's ids
 * and the end token, which equals tokenizing the whole text (digits never merge). */
START_TEST(test_task_encode)
{
    qd_tokenizer *tok = tiny_tokenizer();
    int32_t *ids, *want, end;
    size_t n, np, nw;
    ck_assert_int_eq(qd_task_end_id(tok, &end), QD_OK);
    ck_assert_int_eq(end, 269);
    ck_assert_int_eq(qd_task_encode(tok, "What is 35 + 79?", "114", &ids, &n, &np), QD_OK);
    want = encode(tok, "Q: What is 35 + 79?\nA: 114<|endoftext|>", &nw);
    ck_assert_uint_eq(n, nw);
    ck_assert_mem_eq(ids, want, n * sizeof *ids);
    ck_assert_int_eq(ids[n - 1], end);
    ck_assert_uint_eq(np, n - 4); /* "1", "1", "4", end */
    free(want);
    want = encode(tok, "Q: What is 35 + 79?\nA: ", &nw);
    ck_assert_uint_eq(np, nw);
    ck_assert_mem_eq(ids, want, np * sizeof *ids);
    free(want);
    free(ids);
    ck_assert_int_eq(qd_task_encode(tok, "What is 35 + 79?", NULL, &ids, &n, &np), QD_OK);
    ck_assert_uint_eq(n, np);
    ck_assert_uint_eq(n, nw);
    free(ids);
    qd_tokenizer_free(tok);
}
END_TEST

/* The reward of the completion text (with "<|endoftext|>" spelled inside it). */
static float reward_of(const qd_tokenizer *tok, const char *completion, const char *gold, int *fmt)
{
    size_t n;
    int32_t *ids = encode(tok, completion, &n);
    float r = -1;
    ck_assert_int_eq(qd_task_reward(tok, ids, n, gold, &r, fmt), QD_OK);
    free(ids);
    return r;
}

START_TEST(test_task_reward)
{
    qd_tokenizer *tok = tiny_tokenizer();
    int fmt;
    ck_assert_float_eq(reward_of(tok, "114<|endoftext|>", "114", &fmt), 1.0f);
    ck_assert_int_eq(fmt, 1);
    ck_assert_float_eq(reward_of(tok, " 114 \n<|endoftext|>", "114", &fmt), 1.0f); /* trimmed */
    ck_assert_float_eq(reward_of(tok, "114<|endoftext|>7", "114", &fmt), 1.0f);   /* after the end: ignored */
    ck_assert_float_eq(reward_of(tok, "114", "114", &fmt), 1.0f);                 /* no end token */
    ck_assert_int_eq(fmt, 0);
    ck_assert_float_eq(reward_of(tok, "1147<|endoftext|>", "114", &fmt), 0.0f);
    ck_assert_int_eq(fmt, 1);
    ck_assert_float_eq(reward_of(tok, "-114<|endoftext|>", "114", &fmt), 0.0f);
    ck_assert_float_eq(reward_of(tok, "11<|endoftext|>4", "114", &fmt), 0.0f);
    ck_assert_float_eq(reward_of(tok, "1 14<|endoftext|>", "114", &fmt), 0.0f);
    ck_assert_float_eq(reward_of(tok, "114<|im_end|>", "114", &fmt), 0.0f); /* another special is text */
    ck_assert_float_eq(reward_of(tok, "<|endoftext|>", "114", &fmt), 0.0f);
    ck_assert_int_eq(fmt, 1);
    ck_assert_float_eq(reward_of(tok, "-5<|endoftext|>", "-5", &fmt), 1.0f);
    /* ids that name no token: wrong, not an error */
    int32_t bad[] = {49, 49, 52, 100000, 269};
    float r = -1;
    ck_assert_int_eq(qd_task_reward(tok, bad, 5, "114", &r, &fmt), QD_OK);
    ck_assert_float_eq(r, 0.0f);
    ck_assert_int_eq(fmt, 1);
    qd_tokenizer_free(tok);
}
END_TEST

Suite *suite_tiny(void)
{
    Suite *s = suite_create("tiny");
    TCase *tc = tcase_create("task");
    tcase_add_test(tc, test_task_prompt_format);
    tcase_add_test(tc, test_task_parse);
    tcase_add_test(tc, test_task_encode);
    tcase_add_test(tc, test_task_reward);
    suite_add_tcase(s, tc);
    return s;
}
