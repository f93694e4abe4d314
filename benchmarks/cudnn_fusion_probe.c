/* What cuDNN's graph API offers for fusing BatchNorm into yolo26n's convolutions (issue 22), measured on the GPU:
 * for a convolution shape, which engines take each fusion graph, with which notes (runtime compilation,
 * non-determinism), how long a plan takes to make, its time a call against the convolution alone, whether two
 * runs give the same bits, and how far its per-channel sums are from double-precision sums of its own output.
 *
 * Graphs (NHWC bf16 activations, float accumulation):
 *   conv       x -> conv -> y
 *   genstats   x -> conv -> y, y -> GenStats -> sum, sqsum (per channel, float)
 *   reduce     x -> conv -> v (virtual float) -> identity -> y; v -> reduction add -> sum; v*v -> add -> sqsum
 *   prologue   x -> *scale +bias -> swish (virtual) -> conv -> y, y -> GenStats -> sum, sqsum
 *   prologue_relu  the same with relu for swish (cuDNN's ConvBN pattern)
 * and the stem's convolution alone, with its 3 input channels and with them padded to 4 and 8. A call's time is
 * the mean over `iters` calls back to back, each making its variant pack (the same host work for every graph).
 * Results: benchmarks/RESULTS.md, issue 22, thirteenth session.
 *
 *   cc -O2 -o /tmp/probe benchmarks/cudnn_fusion_probe.c -I$CUDA/include -L$CUDA/lib64 -lcudnn -lcudart -lm
 *   /tmp/probe [iters]
 */
#include <cuda_runtime.h>
#include <cudnn.h>

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef cudnnBackendDescriptor_t D;

#define CK(call)                                                                                                      \
    do {                                                                                                              \
        cudnnStatus_t s_ = (call);                                                                                    \
        if (s_ != CUDNN_STATUS_SUCCESS) {                                                                             \
            fprintf(stderr, "  %s:%d %s: %s\n", __FILE__, __LINE__, #call, cudnnGetErrorString(s_));                  \
            return -1;                                                                                                \
        }                                                                                                             \
    } while (0)
#define CU(call)                                                                                                      \
    do {                                                                                                              \
        cudaError_t e_ = (call);                                                                                      \
        if (e_ != cudaSuccess) {                                                                                      \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));                    \
            exit(1);                                                                                                  \
        }                                                                                                             \
    } while (0)

enum { U_X = 1, U_W, U_Y, U_SUM, U_SQ, U_SCALE, U_BIAS, U_V0 = 100 };

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static int attr(D d, cudnnBackendAttributeName_t n, cudnnBackendAttributeType_t t, int64_t k, const void *v)
{
    CK(cudnnBackendSetAttribute(d, n, t, k, v));
    return 0;
}
#define SET(d, n, t, k, v)                                                                                            \
    do {                                                                                                              \
        if (attr(d, n, t, k, v))                                                                                      \
            return -1;                                                                                                \
    } while (0)
#define SETD(d, n, v)                                                                                                 \
    do {                                                                                                              \
        D v_ = (v);                                                                                                   \
        SET(d, n, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v_);                                                             \
    } while (0)

/* an NHWC tensor of logical dims (n, c, h, w) */
static int tensor(int64_t uid, cudnnDataType_t dt, int64_t n, int64_t c, int64_t h, int64_t w, int virt, D *out)
{
    const int64_t dims[4] = {n, c, h, w}, str[4] = {h * w * c, 1, w * c, c}, al = 16;
    const bool v = virt != 0;
    CK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, out));
    SET(*out, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    SET(*out, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
    SET(*out, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str);
    SET(*out, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    SET(*out, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &al);
    SET(*out, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v);
    CK(cudnnBackendFinalize(*out));
    return 0;
}

static int pointwise(cudnnPointwiseMode_t mode, D x, D b, D y, D *out)
{
    D pw;
    const cudnnDataType_t f = CUDNN_DATA_FLOAT;
    CK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, &pw));
    SET(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    SET(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &f);
    if (mode == CUDNN_POINTWISE_SWISH_FWD) {
        const float beta = 1.0f;
        SET(pw, CUDNN_ATTR_POINTWISE_SWISH_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
    }
    CK(cudnnBackendFinalize(pw));
    CK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, out));
    SETD(*out, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    SETD(*out, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b)
        SETD(*out, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    SETD(*out, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    CK(cudnnBackendFinalize(*out));
    return 0;
}

static int conv_op(int k, int stride, D x, D w, D y, D *out)
{
    D cd;
    const cudnnDataType_t f = CUDNN_DATA_FLOAT;
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    const int64_t nd = 2, one[2] = {1, 1}, st[2] = {stride, stride}, pad[2] = {k / 2, k / 2};
    const float alpha = 1.0f, beta = 0.0f;
    CK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &cd));
    SET(cd, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
    SET(cd, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
    SET(cd, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &nd);
    SET(cd, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, one);
    SET(cd, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, st);
    SET(cd, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
    SET(cd, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
    CK(cudnnBackendFinalize(cd));
    CK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, out));
    SETD(*out, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, x);
    SETD(*out, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w);
    SETD(*out, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, y);
    SETD(*out, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, cd);
    SET(*out, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
    SET(*out, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
    CK(cudnnBackendFinalize(*out));
    return 0;
}

static int genstats(D y, D sum, D sq, D *out)
{
    const cudnnGenStatsMode_t mode = CUDNN_GENSTATS_SUM_SQSUM;
    const cudnnDataType_t f = CUDNN_DATA_FLOAT;
    CK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR, out));
    SET(*out, CUDNN_ATTR_OPERATION_GENSTATS_MODE, CUDNN_TYPE_GENSTATS_MODE, 1, &mode);
    SET(*out, CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &f);
    SETD(*out, CUDNN_ATTR_OPERATION_GENSTATS_XDESC, y);
    SETD(*out, CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC, sum);
    SETD(*out, CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC, sq);
    CK(cudnnBackendFinalize(*out));
    return 0;
}

static int reduce_add(D x, D y, D *out)
{
    D rd;
    const cudnnReduceTensorOp_t op = CUDNN_REDUCE_TENSOR_ADD;
    const cudnnDataType_t f = CUDNN_DATA_FLOAT;
    CK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, &rd));
    SET(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &op);
    SET(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
    CK(cudnnBackendFinalize(rd));
    CK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, out));
    SETD(*out, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    SETD(*out, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    SETD(*out, CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd);
    CK(cudnnBackendFinalize(*out));
    return 0;
}

typedef struct {
    int n, cin, h, w, cout, k, stride, conv_only;
} shape;

enum { G_CONV, G_GENSTATS, G_REDUCE, G_PROLOGUE, G_PROLOGUE_RELU, G_COUNT };
static const char *GNAME[G_COUNT] = {"conv", "genstats", "reduce", "prologue", "prologue_relu"};

/* the operations of graph g over shape s */
static int build(int g, const shape *s, D *ops, int *nops)
{
    const cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, f = CUDNN_DATA_FLOAT;
    const int ho = (s->h - 1) / s->stride + 1, wo = (s->w - 1) / s->stride + 1;
    D x, w, y, sum, sq, v, v2, sc, bi, a, b, c;
    int n = 0;
    if (tensor(U_X, bf, s->n, s->cin, s->h, s->w, 0, &x) || tensor(U_W, bf, s->cout, s->cin, s->k, s->k, 0, &w) ||
        tensor(U_Y, bf, s->n, s->cout, ho, wo, 0, &y) || tensor(U_SUM, f, 1, s->cout, 1, 1, 0, &sum) ||
        tensor(U_SQ, f, 1, s->cout, 1, 1, 0, &sq))
        return -1;
    if (g == G_CONV || g == G_GENSTATS) {
        if (conv_op(s->k, s->stride, x, w, y, &ops[n++]))
            return -1;
        if (g == G_GENSTATS && genstats(y, sum, sq, &ops[n++]))
            return -1;
    } else if (g == G_REDUCE) {
        if (tensor(U_V0, f, s->n, s->cout, ho, wo, 1, &v) || tensor(U_V0 + 1, f, s->n, s->cout, ho, wo, 1, &v2) ||
            conv_op(s->k, s->stride, x, w, v, &ops[n++]) ||
            pointwise(CUDNN_POINTWISE_IDENTITY, v, NULL, y, &ops[n++]) || reduce_add(v, sum, &ops[n++]) ||
            pointwise(CUDNN_POINTWISE_MUL, v, v, v2, &ops[n++]) || reduce_add(v2, sq, &ops[n++]))
            return -1;
    } else {
        if (tensor(U_SCALE, f, 1, s->cin, 1, 1, 0, &sc) || tensor(U_BIAS, f, 1, s->cin, 1, 1, 0, &bi) ||
            tensor(U_V0, f, s->n, s->cin, s->h, s->w, 1, &a) ||
            tensor(U_V0 + 1, f, s->n, s->cin, s->h, s->w, 1, &b) ||
            tensor(U_V0 + 2, f, s->n, s->cin, s->h, s->w, 1, &c) ||
            pointwise(CUDNN_POINTWISE_MUL, x, sc, a, &ops[n++]) ||
            pointwise(CUDNN_POINTWISE_ADD, a, bi, b, &ops[n++]) ||
            pointwise(g == G_PROLOGUE ? CUDNN_POINTWISE_SWISH_FWD : CUDNN_POINTWISE_RELU_FWD, b, NULL, c, &ops[n++]) ||
            conv_op(s->k, s->stride, c, w, y, &ops[n++]) || genstats(y, sum, sq, &ops[n++]))
            return -1;
    }
    *nops = n;
    return 0;
}

static int engine_notes(D cfg, int64_t *index, char *buf, size_t len)
{
    D eng;
    int64_t got = 0, nn = 0, nb = 0;
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    cudnnBackendBehaviorNote_t behav[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
    static const char *nname[] = {"tensor_core",  "down_convert", "reduced_precision_reduction",
                                  "fft",          "nondeterministic", "winograd", "winograd4x4", "winograd6x6",
                                  "winograd13x13", "strict_nan"};
    static const char *bname[] = {"runtime_compilation", "requires_filter_int8x32", "requires_bias_int8x32",
                                  "supports_cuda_graph_native_api"};
    CK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng));
    CK(cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got, &eng));
    CK(cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &got, index));
    CK(cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &nn, notes));
    CK(cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                                CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &nb, behav));
    buf[0] = 0;
    for (int64_t i = 0; i < nn; i++)
        if ((size_t)notes[i] < sizeof nname / sizeof *nname)
            snprintf(buf + strlen(buf), len - strlen(buf), "%s ", nname[notes[i]]);
    for (int64_t i = 0; i < nb; i++)
        if ((size_t)behav[i] < sizeof bname / sizeof *bname)
            snprintf(buf + strlen(buf), len - strlen(buf), "%s ", bname[behav[i]]);
    cudnnBackendDestroyDescriptor(eng);
    return 0;
}

typedef struct {
    void *x, *w, *y, *sum, *sq, *scale, *bias, *ws;
    size_t ws_bytes;
} buffers;

/* the graph's own tensors only: x, w, y, then the sums, then the prologue's scale and bias */
static int execute(cudnnHandle_t h, D plan, const buffers *b, int g)
{
    D vp;
    const int64_t uids[7] = {U_X, U_W, U_Y, U_SUM, U_SQ, U_SCALE, U_BIAS};
    void *ptrs[7] = {b->x, b->w, b->y, b->sum, b->sq, b->scale, b->bias};
    const int64_t n = g == G_CONV ? 3 : g >= G_PROLOGUE ? 7 : 5;
    CK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp));
    SET(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    SET(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    SET(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &b->ws);
    CK(cudnnBackendFinalize(vp));
    CK(cudnnBackendExecute(h, plan, vp));
    cudnnBackendDestroyDescriptor(vp);
    return 0;
}

static float bf16_to_float(uint16_t v)
{
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* every engine cuDNN's heuristics offer for graph g: notes, plan time, call time, run-to-run bits, sums' error */
static void probe(cudnnHandle_t h, int g, const shape *s, buffers *b, int iters)
{
    D ops[8], graph, heur, cfgs[32];
    int nops = 0;
    int64_t ncfg = 0;
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    const int ho = (s->h - 1) / s->stride + 1, wo = (s->w - 1) / s->stride + 1;
    const size_t ny = (size_t)s->n * ho * wo * s->cout;
    printf("%s n%d %dx%d %d->%d k%d s%d:", GNAME[g], s->n, s->h, s->w, s->cin, s->cout, s->k, s->stride);
    if (build(g, s, ops, &nops) || cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &graph) ||
        attr(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h) ||
        attr(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, nops, ops)) {
        printf(" graph not built\n");
        return;
    }
    cudnnStatus_t st = cudnnBackendFinalize(graph);
    if (st != CUDNN_STATUS_SUCCESS) {
        printf(" graph refused (%s)\n", cudnnGetErrorString(st));
        return;
    }
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur) ||
        attr(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph) ||
        attr(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode) ||
        (st = cudnnBackendFinalize(heur)) != CUDNN_STATUS_SUCCESS) {
        printf(" no heuristics (%s)\n", cudnnGetErrorString(st));
        return;
    }
    for (int i = 0; i < 32; i++)
        cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[i]);
    cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 32, &ncfg, cfgs);
    printf(" %lld engine configs\n", (long long)ncfg);
    int shown = 0;
    for (int64_t i = 0; i < ncfg && shown < 4; i++) {
        int64_t index = -1, ws = 0, got = 0;
        char notes[256];
        D plan;
        if (engine_notes(cfgs[i], &index, notes, sizeof notes))
            continue;
        const double t0 = now();
        cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan);
        attr(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
        attr(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
        st = cudnnBackendFinalize(plan);
        const double tplan = now() - t0;
        if (st != CUDNN_STATUS_SUCCESS) {
            printf("  engine %lld [%s]: plan refused (%s)\n", (long long)index, notes, cudnnGetErrorString(st));
            continue;
        }
        cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got, &ws);
        if ((size_t)ws > b->ws_bytes) {
            printf("  engine %lld [%s]: workspace %lld too large\n", (long long)index, notes, (long long)ws);
            continue;
        }
        shown++;
        float sums[2][2][1024];
        int ok = 1;
        for (int r = 0; r < 2 && ok; r++) {
            CU(cudaMemset(b->sum, 0, s->cout * 4));
            CU(cudaMemset(b->sq, 0, s->cout * 4));
            ok = execute(h, plan, b, g) == 0;
            CU(cudaDeviceSynchronize());
            CU(cudaMemcpy(sums[r][0], b->sum, s->cout * 4, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(sums[r][1], b->sq, s->cout * 4, cudaMemcpyDeviceToHost));
        }
        if (!ok) {
            printf("  engine %lld [%s]: execution failed\n", (long long)index, notes);
            continue;
        }
        cudaEvent_t e0, e1;
        float ms = 0;
        CU(cudaEventCreate(&e0));
        CU(cudaEventCreate(&e1));
        for (int it = 0; it < 5; it++)
            execute(h, plan, b, g);
        CU(cudaEventRecord(e0, 0));
        for (int it = 0; it < iters; it++)
            execute(h, plan, b, g);
        CU(cudaEventRecord(e1, 0));
        CU(cudaEventSynchronize(e1));
        CU(cudaEventElapsedTime(&ms, e0, e1));
        printf("  engine %lld [%s]: plan %.0f ms, workspace %lld, %.2f us a call", (long long)index, notes,
               tplan * 1e3, (long long)ws, 1e3 * ms / iters);
        if (g != G_CONV) {
            /* the sums against double sums of the bf16 output it wrote (for the reduce graph the output is the
             * float accumulator rounded, so those differ by the rounding) */
            uint16_t *y = (uint16_t *)malloc(ny * 2);
            double err = 0, scale = 0;
            CU(cudaMemcpy(y, b->y, ny * 2, cudaMemcpyDeviceToHost));
            for (int c = 0; c < s->cout; c++) {
                double ds = 0, dq = 0;
                for (size_t p = c; p < ny; p += s->cout) {
                    const double v = bf16_to_float(y[p]);
                    ds += v;
                    dq += v * v;
                }
                err = fmax(err, fabs(sums[0][0][c] - ds));
                err = fmax(err, fabs(sums[0][1][c] - dq));
                scale = fmax(scale, fabs(dq));
            }
            free(y);
            printf(", sums %s run to run, max |sum - double| %.3g (sqsum up to %.3g)",
                   memcmp(sums[0], sums[1], sizeof sums[0]) ? "DIFFER" : "equal", err, scale);
        }
        printf("\n");
        cudnnBackendDestroyDescriptor(plan);
    }
    for (int i = 0; i < 32; i++)
        cudnnBackendDestroyDescriptor(cfgs[i]);
}

int main(int argc, char **argv)
{
    const int iters = argc > 1 ? atoi(argv[1]) : 200;
    /* yolo26n at batch 4, 640: a 3x3 at P3, a 3x3 at P5, the stride-2 3x3 into P2, a 1x1 at P4 */
    static const shape shapes[] = {{4, 64, 80, 80, 64, 3, 1, 0}, {4, 128, 20, 20, 128, 3, 1, 0},
                                   {4, 16, 320, 320, 32, 3, 2, 0}, {4, 128, 40, 40, 64, 1, 1, 0},
                                   /* the stem, with its 3 input channels and padded to 4 and 8 */
                                   {4, 3, 640, 640, 16, 3, 2, 1}, {4, 4, 640, 640, 16, 3, 2, 1},
                                   {4, 8, 640, 640, 16, 3, 2, 1}};
    cudnnHandle_t h;
    buffers b = {0};
    setvbuf(stdout, NULL, _IOLBF, 0); /* cuDNN's errors (stderr) in place among the lines */
    printf("cuDNN %zu, ", cudnnGetVersion());
    {
        struct cudaDeviceProp p;
        CU(cudaGetDeviceProperties(&p, 0));
        printf("%s\n", p.name);
    }
    if (cudnnCreate(&h) != CUDNN_STATUS_SUCCESS)
        return 1;
    const size_t big = (size_t)64 << 20;
    b.ws_bytes = (size_t)256 << 20;
    CU(cudaMalloc(&b.x, big));
    CU(cudaMalloc(&b.w, 1 << 20));
    CU(cudaMalloc(&b.y, big));
    CU(cudaMalloc(&b.sum, 4096));
    CU(cudaMalloc(&b.sq, 4096));
    CU(cudaMalloc(&b.scale, 4096));
    CU(cudaMalloc(&b.bias, 4096));
    CU(cudaMalloc(&b.ws, b.ws_bytes));
    {
        /* x ~ 1 + N(0,1)-ish bf16 values, w small, scale 1, bias 0 */
        const size_t nx = big / 2;
        uint16_t *hx = (uint16_t *)malloc(big);
        uint32_t r = 12345;
        for (size_t i = 0; i < nx; i++) {
            r = r * 1664525u + 1013904223u;
            const float v = 1.0f + ((float)(r >> 8) / 16777216.0f - 0.5f) * 3.0f;
            uint32_t u;
            memcpy(&u, &v, 4);
            hx[i] = (uint16_t)(u >> 16);
        }
        CU(cudaMemcpy(b.x, hx, big, cudaMemcpyHostToDevice));
        for (size_t i = 0; i < (1 << 19); i++) {
            r = r * 1664525u + 1013904223u;
            const float v = ((float)(r >> 8) / 16777216.0f - 0.5f) * 0.2f;
            uint32_t u;
            memcpy(&u, &v, 4);
            hx[i] = (uint16_t)(u >> 16);
        }
        CU(cudaMemcpy(b.w, hx, 1 << 20, cudaMemcpyHostToDevice));
        float one[1024], zero[1024];
        for (int i = 0; i < 1024; i++) {
            one[i] = 1.0f;
            zero[i] = 0.0f;
        }
        CU(cudaMemcpy(b.scale, one, 4096, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(b.bias, zero, 4096, cudaMemcpyHostToDevice));
        free(hx);
    }
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        for (int g = 0; g < (shapes[i].conv_only ? 1 : G_COUNT); g++) {
            probe(h, g, &shapes[i], &b, iters);
            fflush(stdout);
        }
    cudnnDestroy(h);
    return 0;
}
