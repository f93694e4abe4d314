/* What the fast CPU kernels share: per-ISA clones of the inner loops, a vectorisable expf, and the
 * threshold below which a loop stays on the calling thread.
 *
 * Inner loops are plain C written so that GCC vectorises them (`#pragma omp simd`), compiled three
 * times (SSE2, AVX2, AVX-512) with target_clones; the loader picks the clone for the running CPU
 * (an ifunc resolved once). The OpenMP loops that call them are not cloned: each task calls one cloned
 * function. */
#ifndef PTL_CPU_VECTOR_H
#define PTL_CPU_VECTOR_H

#include <stdint.h>
#include <string.h>

/* Code generation only, values unchanged. Floating-point exceptions are never enabled, so they need not
 * be kept exact: without no-trapping-math GCC will not turn the clamps of ptl_cpu_expf into selects and
 * the loops calling it stay scalar. Jump threading splits those loops into a path per clamp, whose
 * vector code runs 6x slower (measured: SiLU 4.4 ns against 0.7 ns per element on AVX-512). */
#pragma GCC optimize("no-trapping-math", "no-thread-jumps")

#define PTL_CPU_CLONES __attribute__((target_clones("default", "avx2", "avx512f")))

/* Below this many elements a loop runs on the calling thread: waking the team costs more. */
#define PTL_CPU_PAR_MIN 32768

/* An element-wise pass over n elements: `stmt` runs for [i0, i1) on fixed chunks of PTL_CPU_CHUNK
 * elements (64 KiB of float), one task each, in parallel above PTL_CPU_PAR_MIN; the chunks, not the
 * thread count, decide the split. */
#define PTL_CPU_CHUNK 16384
#define PTL_CPU_FOR_CHUNKS(n, i0, i1, stmt)                                                                \
    do {                                                                                                   \
        const int64_t n_ = (n), nchunks_ = (n_ + PTL_CPU_CHUNK - 1) / PTL_CPU_CHUNK;                      \
        _Pragma("omp parallel for schedule(dynamic, 1) if (n_ > PTL_CPU_PAR_MIN)")                         \
        for (int64_t k_ = 0; k_ < nchunks_; k_++) {                                                        \
            const int64_t i0 = k_ * PTL_CPU_CHUNK, i1 = k_ + 1 < nchunks_ ? i0 + PTL_CPU_CHUNK : n_;       \
            stmt;                                                                                          \
        }                                                                                                  \
    } while (0)

/* e^x in float, within 1.5 ulp of the exact value for |x| <= 87 (Cephes' polynomial on a
 * round-to-nearest range reduction); arguments are clamped to [-87, 88], NaN propagates. Branch-free,
 * so a loop calling it vectorises. */
static inline float ptl_cpu_expf(float x)
{
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f; /* round(x / ln 2): 1.5 * 2^23 */
    float r = x - n * 0.693359375f;                                /* ln 2 in two parts */
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23; /* 2^n */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

static inline float ptl_cpu_sigmoidf(float z) { return 1.0f / (1.0f + ptl_cpu_expf(-z)); }

#endif
