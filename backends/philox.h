/* Philox4x32-10, the counter-based generator of the exact mode's sampling
 * (NUMERICS.md §6): J. K. Salmon, M. A. Moraes, R. O. Dror, D. E. Shaw,
 * "Parallel random numbers: as easy as 1, 2, 3", SC'11, §4 (Philox).
 * A pure function of (key, counter), so a draw depends only on what it is
 * keyed by, never on batch size, thread count or backend. Only 32-bit
 * integer work; one static inline definition for host and device (QD_HD).
 *
 * The mapping used for sampling (qd_philox_sample_u):
 *   key     = { seed & 0xffffffff, seed >> 32 }
 *   counter = { position, seq_id & 0xffffffff, seq_id >> 32, draw }
 * with draw = QD_PHILOX_DRAW_SAMPLE for the token draw; other consumers of
 * randomness at the same (seed, sequence, position) take other draw values. */
#ifndef QD_PHILOX_H
#define QD_PHILOX_H

#include <stdint.h>
#include "quant/numerics.h"

#define QD_PHILOX_M0 0xD2511F53u /* round multipliers (SC'11 Table 2) */
#define QD_PHILOX_M1 0xCD9E8D57u
#define QD_PHILOX_W0 0x9E3779B9u /* key schedule: golden ratio */
#define QD_PHILOX_W1 0xBB67AE85u /* key schedule: sqrt(3) - 1 */
#define QD_PHILOX_ROUNDS 10

#define QD_PHILOX_DRAW_SAMPLE 0u /* counter word 3 of the token draw */

/* One Philox S-box round: two 32x32->64 products, the halves xored with the
 * other words and the round key, words permuted as in Random123. */
QD_HD void qd_philox4x32_round(uint32_t ctr[4], const uint32_t key[2])
{
    uint64_t p0 = (uint64_t)QD_PHILOX_M0 * ctr[0];
    uint64_t p1 = (uint64_t)QD_PHILOX_M1 * ctr[2];
    uint32_t c1 = ctr[1], c3 = ctr[3];
    ctr[0] = (uint32_t)(p1 >> 32) ^ c1 ^ key[0];
    ctr[1] = (uint32_t)p1;
    ctr[2] = (uint32_t)(p0 >> 32) ^ c3 ^ key[1];
    ctr[3] = (uint32_t)p0;
}

/* out = Philox4x32-10(counter, key): 10 rounds, the key bumped by the Weyl
 * constants between rounds (so round r uses key + r * W, wrapping). */
QD_HD void qd_philox4x32_10(uint32_t out[4], const uint32_t counter[4], const uint32_t key[2])
{
    uint32_t k[2] = { key[0], key[1] };
    for (int i = 0; i < 4; i++)
        out[i] = counter[i];
    for (int r = 0; r < QD_PHILOX_ROUNDS; r++) {
        if (r > 0) {
            k[0] += QD_PHILOX_W0;
            k[1] += QD_PHILOX_W1;
        }
        qd_philox4x32_round(out, k);
    }
}

/* A uniform float in [0, 1): the top 24 bits of x times 2^-24 (exact; every
 * multiple of 2^-24 in [0, 1 - 2^-24] equally likely). */
QD_HD float qd_philox_u01(uint32_t x) { return (float)(x >> 8) * 0x1.0p-24f; }

/* The token draw of sequence seq_id at position under seed: word 0 of
 * Philox4x32-10 with the mapping in this file's header, as a uniform float. */
QD_HD float qd_philox_sample_u(uint64_t seed, uint64_t seq_id, uint32_t position)
{
    uint32_t key[2] = { (uint32_t)seed, (uint32_t)(seed >> 32) };
    uint32_t ctr[4] = { position, (uint32_t)seq_id, (uint32_t)(seq_id >> 32), QD_PHILOX_DRAW_SAMPLE };
    uint32_t out[4];
    qd_philox4x32_10(out, ctr, key);
    return qd_philox_u01(out[0]);
}

#endif /* QD_PHILOX_H */
