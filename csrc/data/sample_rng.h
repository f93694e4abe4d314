/* Per-sample random streams: Philox4x32-10 keyed by the seed, counter (index, epoch, stream, block).
 * Draw k of a stream is a pure function of (seed, epoch, index, stream, k). Uses the generator of
 * ops/philox.h with the data pipeline's own counter layout. */
#ifndef PTL_DATA_SAMPLE_RNG_H
#define PTL_DATA_SAMPLE_RNG_H

#include <stdint.h>

#include "../ops/philox.h"

typedef struct {
    uint32_t key[2];
    uint32_t ctr[4];
    uint32_t buf[4];
    int pos;
} ptl_sample_rng;

enum { PTL_STREAM_AUG = 0, PTL_STREAM_SHUFFLE = 1 };

static inline void ptl_sample_rng_init(ptl_sample_rng *g, uint64_t seed, uint32_t epoch, uint32_t index,
                                       uint32_t stream)
{
    g->key[0] = (uint32_t)seed;
    g->key[1] = (uint32_t)(seed >> 32);
    g->ctr[0] = index;
    g->ctr[1] = epoch;
    g->ctr[2] = stream;
    g->ctr[3] = 0;
    g->pos = 4;
}

static inline uint32_t ptl_sample_u32(ptl_sample_rng *g)
{
    if (g->pos == 4) {
        ptl_philox_block b = ptl_philox4x32_10(g->ctr[0], g->ctr[1], g->ctr[2], g->ctr[3], g->key[0], g->key[1]);
        g->buf[0] = b.v[0], g->buf[1] = b.v[1], g->buf[2] = b.v[2], g->buf[3] = b.v[3];
        g->ctr[3]++;
        g->pos = 0;
    }
    return g->buf[g->pos++];
}

/* Uniform in [0, 1) with 53 random bits. */
static inline double ptl_sample_uniform(ptl_sample_rng *g)
{
    uint64_t hi = ptl_sample_u32(g) >> 5, lo = ptl_sample_u32(g) >> 6;
    return (double)((hi << 26) | lo) * (1.0 / 9007199254740992.0);
}

/* Uniform integer in [0, n) without modulo bias (n > 0). */
static inline uint32_t ptl_sample_below(ptl_sample_rng *g, uint32_t n)
{
    uint64_t m = (uint64_t)ptl_sample_u32(g) * n;
    uint32_t l = (uint32_t)m;
    if (l < n) {
        uint32_t t = (uint32_t)(-n) % n;
        while (l < t) {
            m = (uint64_t)ptl_sample_u32(g) * n;
            l = (uint32_t)m;
        }
    }
    return (uint32_t)(m >> 32);
}

#endif
