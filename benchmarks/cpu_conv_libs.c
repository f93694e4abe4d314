/* Which library for the fast CPU convolutions (issue 20): oneDNN against im2col + an OpenBLAS sgemm, on
 * yolo26n's convolution shapes at batch 4, NHWC activations and OHWI weights, float32, all three
 * directions. Standalone (not part of the extension); needs libdnnl-dev and libopenblas-dev:
 *
 *   gcc -O2 -fopenmp benchmarks/cpu_conv_libs.c -o /tmp/cpu_conv_libs -ldnnl -lopenblas
 *   python3 benchmarks/cpu_step.py --print-conv-shapes | OMP_NUM_THREADS=2 /tmp/cpu_conv_libs
 *
 * stdin: one shape per line, "n h w cin cout k stride groups count". oneDNN: primitives picked with
 * "any" weight layouts, the caller's weights reordered per call (and the weight gradient reordered
 * back), scratchpads preallocated. BLAS: each thread runs a single-threaded sgemm on its rows of the
 * im2col matrix (forward, input gradient, whose col2im runs on one thread) or on its output channels
 * (weight gradient); grouped convolutions are left to oneDNN in both totals. Median of 15 runs per
 * direction, ms. */
#include <cblas.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define REPS 15
#define CHECK(x)                                                                                             \
    do {                                                                                                     \
        dnnl_status_t st_ = (x);                                                                             \
        if (st_ != dnnl_success) {                                                                           \
            fprintf(stderr, "%s failed (%d) at line %d\n", #x, (int)st_, __LINE__);                          \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

static dnnl_engine_t engine;
static dnnl_stream_t stream;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *t)
{
    qsort(t, REPS, sizeof *t, cmp);
    return t[REPS / 2];
}

static float *filled(size_t n)
{
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(rand() % 100) * 0.01f;
    return p;
}

static void weights_md(dnnl_memory_desc_t *md, int g, int co, int ci, int k, dnnl_format_tag_t tag1, dnnl_format_tag_t tagg)
{
    if (g == 1) {
        const dnnl_dims_t d = {co, ci, k, k};
        CHECK(dnnl_memory_desc_init_by_tag(md, 4, d, dnnl_f32, tag1));
    } else {
        const dnnl_dims_t d = {g, co / g, ci / g, k, k};
        CHECK(dnnl_memory_desc_init_by_tag(md, 5, d, dnnl_f32, tagg));
    }
}

static dnnl_memory_t mem(const dnnl_memory_desc_t *md, void *data)
{
    dnnl_memory_t m;
    CHECK(dnnl_memory_create(&m, md, engine, data));
    return m;
}

static dnnl_primitive_t reorder(const dnnl_memory_desc_t *from, const dnnl_memory_desc_t *to, int sum)
{
    dnnl_primitive_attr_t attr = NULL;
    if (sum) {
        dnnl_post_ops_t po;
        CHECK(dnnl_primitive_attr_create(&attr));
        CHECK(dnnl_post_ops_create(&po));
        CHECK(dnnl_post_ops_append_sum(po, 1.0f));
        CHECK(dnnl_primitive_attr_set_post_ops(attr, po));
    }
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t p;
    CHECK(dnnl_reorder_primitive_desc_create(&pd, from, engine, to, engine, attr));
    CHECK(dnnl_primitive_create(&p, pd));
    return p;
}

static void run2(dnnl_primitive_t p, int a0, dnnl_memory_t m0, int a1, dnnl_memory_t m1)
{
    const dnnl_exec_arg_t a[2] = {{a0, m0}, {a1, m1}};
    CHECK(dnnl_primitive_execute(p, stream, 2, a));
}

static void run4(dnnl_primitive_t p, int a0, dnnl_memory_t m0, int a1, dnnl_memory_t m1, int a2, dnnl_memory_t m2,
                 dnnl_memory_t scratch)
{
    const dnnl_exec_arg_t a[4] = {{a0, m0}, {a1, m1}, {a2, m2}, {DNNL_ARG_SCRATCHPAD, scratch}};
    CHECK(dnnl_primitive_execute(p, stream, 4, a));
}

static void time_dnnl(int n, int h, int w, int ci, int co, int k, int s, int g, double out[3])
{
    const int p = k / 2, ho = (h + 2 * p - k) / s + 1, wo = (w + 2 * p - k) / s + 1;
    const dnnl_dims_t sd = {n, ci, h, w}, dd = {n, co, ho, wo}, str = {s, s}, pl = {p, p};
    const dnnl_dims_t pr = {(ho - 1) * s + k - h - p, (wo - 1) * s + k - w - p};
    dnnl_memory_desc_t smd, dmd, any, user;
    CHECK(dnnl_memory_desc_init_by_tag(&smd, 4, sd, dnnl_f32, dnnl_nhwc));
    CHECK(dnnl_memory_desc_init_by_tag(&dmd, 4, dd, dnnl_f32, dnnl_nhwc));
    weights_md(&any, g, co, ci, k, dnnl_format_tag_any, dnnl_format_tag_any);
    weights_md(&user, g, co, ci, k, dnnl_ohwi, dnnl_gohwi);
    dnnl_primitive_attr_t attr;
    CHECK(dnnl_primitive_attr_create(&attr));
    CHECK(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    dnnl_convolution_desc_t cd;
    dnnl_primitive_desc_t pd[3];
    CHECK(dnnl_convolution_forward_desc_init(&cd, dnnl_forward_training, dnnl_convolution_direct, &smd, &any, NULL,
                                             &dmd, str, pl, pr));
    CHECK(dnnl_primitive_desc_create(&pd[0], &cd, attr, engine, NULL));
    CHECK(dnnl_convolution_backward_data_desc_init(&cd, dnnl_convolution_direct, &smd, &any, &dmd, str, pl, pr));
    CHECK(dnnl_primitive_desc_create(&pd[1], &cd, attr, engine, pd[0]));
    CHECK(dnnl_convolution_backward_weights_desc_init(&cd, dnnl_convolution_direct, &smd, &any, NULL, &dmd, str, pl,
                                                      pr));
    CHECK(dnnl_primitive_desc_create(&pd[2], &cd, attr, engine, pd[0]));
    const dnnl_query_t wq[3] = {dnnl_query_weights_md, dnnl_query_weights_md, dnnl_query_diff_weights_md};
    dnnl_primitive_t conv[3], re[3];
    dnnl_memory_t wprim[3], scratch[3];
    const size_t wn = (size_t)co * (ci / g) * k * k;
    float *x = filled((size_t)n * h * w * ci), *y = filled((size_t)n * ho * wo * co), *wt = filled(wn), *dw = filled(wn);
    for (int i = 0; i < 3; i++) {
        const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd[i], wq[i], 0);
        const dnnl_memory_desc_t *smd2 = dnnl_primitive_desc_query_md(pd[i], dnnl_query_scratchpad_md, 0);
        CHECK(dnnl_primitive_create(&conv[i], pd[i]));
        wprim[i] = mem(wmd, malloc(dnnl_memory_desc_get_size(wmd) + 64));
        scratch[i] = mem(smd2, malloc(dnnl_memory_desc_get_size(smd2) + 64));
        re[i] = i < 2 ? reorder(&user, wmd, 0) : reorder(wmd, &user, 1);
    }
    dnnl_memory_t ms = mem(&smd, x), md = mem(&dmd, y), mw = mem(&user, wt), mdw = mem(&user, dw);
    double t[3][REPS];
    for (int r = 0; r < REPS; r++) {
        double t0 = now();
        run2(re[0], DNNL_ARG_FROM, mw, DNNL_ARG_TO, wprim[0]);
        run4(conv[0], DNNL_ARG_SRC, ms, DNNL_ARG_WEIGHTS, wprim[0], DNNL_ARG_DST, md, scratch[0]);
        double t1 = now();
        run2(re[1], DNNL_ARG_FROM, mw, DNNL_ARG_TO, wprim[1]);
        run4(conv[1], DNNL_ARG_DIFF_SRC, ms, DNNL_ARG_WEIGHTS, wprim[1], DNNL_ARG_DIFF_DST, md, scratch[1]);
        double t2 = now();
        run4(conv[2], DNNL_ARG_SRC, ms, DNNL_ARG_DIFF_WEIGHTS, wprim[2], DNNL_ARG_DIFF_DST, md, scratch[2]);
        run2(re[2], DNNL_ARG_FROM, wprim[2], DNNL_ARG_TO, mdw);
        double t3 = now();
        t[0][r] = t1 - t0, t[1][r] = t2 - t1, t[2][r] = t3 - t2;
    }
    for (int i = 0; i < 3; i++)
        out[i] = median(t[i]);
}

/* rows [r0, r1) of the im2col matrix (pixel, (ky, kx, ci)) */
static void im2col(const float *x, int h, int w, int ci, int k, int s, int ho, int wo, float *col, long r0, long r1)
{
    const int p = k / 2;
    for (long r = r0; r < r1; r++) {
        const int b = (int)(r / ((long)ho * wo)), oy = (int)(r / wo % ho), ox = (int)(r % wo);
        float *c = col + r * k * k * ci;
        for (int ky = 0; ky < k; ky++)
            for (int kx = 0; kx < k; kx++) {
                const int iy = oy * s - p + ky, ix = ox * s - p + kx;
                float *cc = c + (ky * k + kx) * ci;
                if (iy < 0 || iy >= h || ix < 0 || ix >= w)
                    memset(cc, 0, sizeof(float) * ci);
                else
                    memcpy(cc, x + (((long)b * h + iy) * w + ix) * ci, sizeof(float) * ci);
            }
    }
}

static void col2im(float *dx, int h, int w, int ci, int k, int s, int ho, int wo, const float *col, long rows)
{
    const int p = k / 2;
    for (long r = 0; r < rows; r++) {
        const int b = (int)(r / ((long)ho * wo)), oy = (int)(r / wo % ho), ox = (int)(r % wo);
        const float *c = col + r * k * k * ci;
        for (int ky = 0; ky < k; ky++)
            for (int kx = 0; kx < k; kx++) {
                const int iy = oy * s - p + ky, ix = ox * s - p + kx;
                if (iy < 0 || iy >= h || ix < 0 || ix >= w)
                    continue;
                float *d = dx + (((long)b * h + iy) * w + ix) * ci;
                const float *cc = c + (ky * k + kx) * ci;
                for (int i = 0; i < ci; i++)
                    d[i] += cc[i];
            }
    }
}

static void time_blas(int n, int h, int w, int ci, int co, int k, int s, double out[3])
{
    const int p = k / 2, ho = (h + 2 * p - k) / s + 1, wo = (w + 2 * p - k) / s + 1, K = k * k * ci;
    const long M = (long)n * ho * wo;
    const int direct = k == 1 && s == 1; /* a 1x1 stride-1 convolution is a GEMM on the activations */
    float *x = filled((size_t)n * h * w * ci), *y = filled((size_t)M * co), *wt = filled((size_t)co * K);
    float *dw = filled((size_t)co * K), *col = malloc(sizeof(float) * M * K), *dx = malloc(sizeof(float) * n * h * w * ci);
    double t[3][REPS];
    for (int r = 0; r < REPS; r++) {
        double t0 = now();
#pragma omp parallel
        {
            const int nt = omp_get_num_threads(), id = omp_get_thread_num();
            const long r0 = M * id / nt, r1 = M * (id + 1) / nt;
            const float *a = x + r0 * ci;
            if (!direct) {
                im2col(x, h, w, ci, k, s, ho, wo, col, r0, r1);
                a = col + r0 * K;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(r1 - r0), co, K, 1.f, a, K, wt, K, 0.f,
                        y + r0 * co, co);
        }
        double t1 = now();
        memset(dx, 0, sizeof(float) * n * h * w * ci);
#pragma omp parallel
        {
            const int nt = omp_get_num_threads(), id = omp_get_thread_num();
            const long r0 = M * id / nt, r1 = M * (id + 1) / nt;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(r1 - r0), K, co, 1.f, y + r0 * co, co, wt, K,
                        0.f, (direct ? dx : col) + r0 * K, K);
        }
        if (!direct)
            col2im(dx, h, w, ci, k, s, ho, wo, col, M);
        double t2 = now();
#pragma omp parallel
        {
            const int nt = omp_get_num_threads(), id = omp_get_thread_num();
            const long r0 = M * id / nt, r1 = M * (id + 1) / nt;
            if (!direct)
                im2col(x, h, w, ci, k, s, ho, wo, col, r0, r1);
#pragma omp barrier
            const int c0 = co * id / nt, c1 = co * (id + 1) / nt;
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c1 - c0, K, (int)M, 1.f, y + c0, co, direct ? x : col,
                        K, 1.f, dw + (long)c0 * K, K);
        }
        double t3 = now();
        t[0][r] = t1 - t0, t[1][r] = t2 - t1, t[2][r] = t3 - t2;
    }
    for (int i = 0; i < 3; i++)
        out[i] = median(t[i]);
    free(x), free(y), free(wt), free(dw), free(col), free(dx);
}

int main(void)
{
    openblas_set_num_threads(1);
    CHECK(dnnl_engine_create(&engine, dnnl_cpu, 0));
    CHECK(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags));
    int n, h, w, ci, co, k, s, g, count;
    double total[2][3] = {{0}};
    printf("shape (h w cin cout k s g x count) | oneDNN fwd dx dw | BLAS fwd dx dw (ms)\n");
    while (scanf("%d %d %d %d %d %d %d %d %d", &n, &h, &w, &ci, &co, &k, &s, &g, &count) == 9) {
        double d[3], b[3];
        time_dnnl(n, h, w, ci, co, k, s, g, d);
        if (g == 1)
            time_blas(n, h, w, ci, co, k, s, b);
        else
            memcpy(b, d, sizeof b);
        for (int i = 0; i < 3; i++) {
            total[0][i] += count * d[i];
            total[1][i] += count * b[i];
        }
        printf("%3d %3d %4d %4d %d %d %3d x%-2d | %7.3f %7.3f %7.3f | %7.3f %7.3f %7.3f\n", h, w, ci, co, k, s, g, count,
               1e3 * d[0], 1e3 * d[1], 1e3 * d[2], 1e3 * b[0], 1e3 * b[1], 1e3 * b[2]);
    }
    printf("network total, ms: oneDNN %.1f + %.1f + %.1f = %.1f; BLAS (oneDNN for grouped) %.1f + %.1f + %.1f = %.1f\n",
           1e3 * total[0][0], 1e3 * total[0][1], 1e3 * total[0][2], 1e3 * (total[0][0] + total[0][1] + total[0][2]),
           1e3 * total[1][0], 1e3 * total[1][1], 1e3 * total[1][2], 1e3 * (total[1][0] + total[1][1] + total[1][2]));
    return 0;
}
