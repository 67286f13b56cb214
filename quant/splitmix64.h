/* splitmix64 (Steele, Lea, Flood 2014): the small seeded generator shared by
 * the library (data order, synthetic problems, initial weights), the tests and
 * the benches. Header-only so the CUDA programs can use it too. */
#ifndef QD_SPLITMIX64_H
#define QD_SPLITMIX64_H

#include <stdint.h>

#define QD_SPLITMIX64_GAMMA 0x9e3779b97f4a7c15ULL

/* The finalizer: a bijective mix of 64 bits. */
static inline uint64_t qd_splitmix64_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Advances *state and returns the next output. */
static inline uint64_t qd_splitmix64_next(uint64_t *state)
{
    return qd_splitmix64_mix(*state += QD_SPLITMIX64_GAMMA);
}

/* The next output's top 53 bits as a double in [0, 1) (exact). */
static inline double qd_splitmix64_unit(uint64_t *state)
{
    return (double)(qd_splitmix64_next(state) >> 11) * 0x1.0p-53;
}

#endif
