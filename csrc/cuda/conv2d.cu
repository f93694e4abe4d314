/* 2-D convolution through cuDNN (graph-API execution plans, conv2d_cudnn_graph.h, or the legacy convolution
 * API), cuBLAS (1x1) or direct kernels (3x3 depthwise; the forward of 3x3 with few input channels,
 * conv2d_narrow.h): per-shape plans with algorithms chosen once,
 * caller-owned workspace, no allocation or synchronisation when executing. See conv2d.h. */
#include <stdlib.h>
#include <string.h>

#include "conv2d.h"
#include "conv2d_cudnn_graph.h"
#include "conv2d_narrow.h"
#include "conv2d_find.h"
#include "layers_common.cuh"
#include "call_graph.h"
#include "../nn/elementwise.h"

/* Pointer sets whose calls' graphs a plan's direction keeps: every convolution of its shape, on up to four
 * queues (call_graph.h). */
#define CALL_KEYS 32

/* depthwise kernels' size (see the depthwise section) */
#define DW_K 3
#define DW_TAPS (DW_K * DW_K)

struct ptl_conv2d_plan {
    ptl_conv2d_desc d;
    ptl_dtype dt;
    int device;
    int refs;
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cf, cbd, cbf; /* one per direction: each carries its own math type */
    cudnnConvolutionFwdAlgo_t af;
    cudnnConvolutionBwdDataAlgo_t abd;
    cudnnConvolutionBwdFilterAlgo_t abf;
    int tensor_op[3];
    int gemm;                    /* 1x1, stride 1, ungrouped: plain cuBLAS GEMMs instead of cuDNN */
    cublasComputeType_t gemm_ct; /* its compute type */
    int depthwise;               /* 3x3, groups == cin == cout: the direct kernels below instead of cuDNN */
    int narrow;                  /* 3x3 ungrouped with few input channels: conv2d_narrow.h's forward */
    int narrow_wgrad;            /* and its weight gradient (bfloat16, float16) */
    /* graph-API plans per direction: the first three, or none (the legacy API); backward data adding to dx
     * where cuDNN has an engine for it */
    ptl_cudnn_conv_exec *exec[PTL_CONV_DIRECTIONS];
    ptl_call_graphs *calls[PTL_CONV_DIRECTIONS]; /* each direction's library calls relaunched as graphs */
    ptl_colsum_geom dw_geom;     /* the depthwise weight gradient's reduction over output pixels */
    size_t ws_f, ws_bd, ws_bf, ws_bias, ws;
    ptl_colsum_geom bias_geom;
    int forward_only; /* opts->forward_only: the backward directions were neither planned nor sized */
};

extern "C" ptl_conv2d_plan_opts ptl_conv2d_plan_opts_default(void)
{
    ptl_conv2d_plan_opts o;
    o.deterministic = 1;
    o.allow_tf32 = 0;
    o.find = 0;
    o.workspace_limit = 0;
    const char *api = getenv("PTL_CUDNN_API");
    o.legacy_api = api && !strcmp(api, "legacy");
    o.forward_only = 0;
    return o;
}

static int is_tensor_op(cudnnMathType_t mt)
{
    return mt == CUDNN_TENSOR_OP_MATH || mt == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

static int no_algo(const ptl_conv2d_plan *p, const char *dir, const ptl_conv2d_plan_opts *o)
{
    const ptl_conv2d_desc *d = &p->d;
    return ptl_set_error(PTL_ERR_RUNTIME,
                         "conv2d plan: cuDNN offers no %s algorithm for n=%d h=%d w=%d cin=%d cout=%d k=%d stride=%d "
                         "groups=%d dtype=%s with deterministic=%d allow_tf32=%d workspace_limit=%zu",
                         dir, d->n, d->h, d->w, d->cin, d->cout, d->k, d->stride, d->groups, ptl_dtype_name(p->dt),
                         o->deterministic, o->allow_tf32, o->workspace_limit);
}

/* ---------------------------------------------------------------- algorithm choice
 * Candidates are (algorithm, math type) pairs from cuDNN's heuristics that succeeded and meet the options,
 * best first. The heuristics mode takes the first; the find mode times every candidate (also those the
 * heuristics offer under the other permitted math type) with the exact descriptors and calls a step
 * makes, on scratch buffers, and takes the fastest. Both happen only here, at plan time. */

enum { DIR_FWD = 0, DIR_BWD_DATA = 1, DIR_BWD_FILTER = 2 };
#define MAX_CAND 24

typedef struct {
    int algo;
    cudnnMathType_t mt;
} cand_t;

template <typename Perf>
static void add_cands(const Perf *perf, int count, const ptl_conv2d_plan_opts *o, int strict, cand_t *c, int *nc)
{
    for (int i = 0; i < count && *nc < MAX_CAND; i++) {
        if (perf[i].status != CUDNN_STATUS_SUCCESS)
            continue;
        if (o->deterministic && perf[i].determinism != CUDNN_DETERMINISTIC)
            continue;
        if (o->workspace_limit && perf[i].memory > o->workspace_limit)
            continue;
        if (strict && is_tensor_op(perf[i].mathType))
            continue;
        int dup = 0;
        for (int j = 0; j < *nc; j++)
            dup |= c[j].algo == (int)perf[i].algo && c[j].mt == perf[i].mathType;
        if (!dup) {
            c[*nc].algo = (int)perf[i].algo;
            c[*nc].mt = perf[i].mathType;
            (*nc)++;
        }
    }
}

static cudnnConvolutionDescriptor_t dir_desc(const ptl_conv2d_plan *p, int dir)
{
    return dir == DIR_FWD ? p->cf : dir == DIR_BWD_DATA ? p->cbd : p->cbf;
}

/* Appends the heuristics' candidates for `dir` with the descriptor's math type set to mt. */
static int heuristics(ptl_conv2d_plan *p, cudnnHandle_t h, int dir, cudnnMathType_t mt, const ptl_conv2d_plan_opts *o,
                      int strict, cand_t *c, int *nc)
{
    int ret = 0;
    cudnnConvolutionDescriptor_t cd = dir_desc(p, dir);
    PTL_CUDNN_TRY(cudnnSetConvolutionMathType(cd, mt));
    if (dir == DIR_FWD) {
        cudnnConvolutionFwdAlgoPerf_t pf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        PTL_CUDNN_TRY(cudnnGetConvolutionForwardAlgorithm_v7(h, p->xd, p->wd, cd, p->yd,
                                                             CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &ret, pf));
        add_cands(pf, ret, o, strict, c, nc);
    } else if (dir == DIR_BWD_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t pd[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        PTL_CUDNN_TRY(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p->wd, p->yd, cd, p->xd,
                                                                  CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &ret, pd));
        add_cands(pd, ret, o, strict, c, nc);
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t pw[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        PTL_CUDNN_TRY(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p->xd, p->yd, cd, p->wd,
                                                                    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &ret, pw));
        add_cands(pw, ret, o, strict, c, nc);
    }
    return 0;
fail:
    return -1;
}

/* Sets the descriptor's math type for candidate cd and returns its workspace size (or a cuDNN status). */
static cudnnStatus_t cand_workspace(ptl_conv2d_plan *p, cudnnHandle_t h, int dir, const cand_t *c, int strict,
                                    size_t *bytes)
{
    cudnnConvolutionDescriptor_t cd = dir_desc(p, dir);
    cudnnStatus_t st = cudnnSetConvolutionMathType(cd, strict ? CUDNN_FMA_MATH : c->mt);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    if (dir == DIR_FWD)
        return cudnnGetConvolutionForwardWorkspaceSize(h, p->xd, p->wd, cd, p->yd, (cudnnConvolutionFwdAlgo_t)c->algo,
                                                       bytes);
    if (dir == DIR_BWD_DATA)
        return cudnnGetConvolutionBackwardDataWorkspaceSize(h, p->wd, p->yd, cd, p->xd,
                                                            (cudnnConvolutionBwdDataAlgo_t)c->algo, bytes);
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p->xd, p->yd, cd, p->wd,
                                                          (cudnnConvolutionBwdFilterAlgo_t)c->algo, bytes);
}

static cudnnStatus_t cand_run(ptl_conv2d_plan *p, cudnnHandle_t h, int dir, int algo, void *x, void *w, void *y,
                              void *ws, size_t wsb)
{
    const float one = 1.0f, zero = 0.0f;
    if (dir == DIR_FWD)
        return cudnnConvolutionForward(h, &one, p->xd, x, p->wd, w, p->cf, (cudnnConvolutionFwdAlgo_t)algo, ws, wsb,
                                       &zero, p->yd, y);
    if (dir == DIR_BWD_DATA)
        return cudnnConvolutionBackwardData(h, &one, p->wd, w, p->yd, y, p->cbd, (cudnnConvolutionBwdDataAlgo_t)algo,
                                            ws, wsb, &zero, p->xd, x);
    return cudnnConvolutionBackwardFilter(h, &one, p->xd, x, p->yd, y, p->cbf, (cudnnConvolutionBwdFilterAlgo_t)algo,
                                          ws, wsb, &one, p->wd, w);
}

/* One timed run of legacy candidate i of a direction (the find option). */
typedef struct {
    ptl_conv2d_plan *p;
    cudnnHandle_t h;
    int dir, strict;
    const cand_t *cands;
} legacy_trial;

static int legacy_run(void *arg, int i, const ptl_conv_find_buffers *b)
{
    const legacy_trial *t = (const legacy_trial *)arg;
    size_t need = 0;
    if (cand_workspace(t->p, t->h, t->dir, &t->cands[i], t->strict, &need) != CUDNN_STATUS_SUCCESS ||
        need > b->workspace)
        return -1;
    return cand_run(t->p, t->h, t->dir, t->cands[i].algo, b->buf[0], b->buf[1], b->buf[2], b->buf[3],
                    b->workspace) == CUDNN_STATUS_SUCCESS
               ? 0
               : -1;
}

static int choose(ptl_conv2d_plan *p, ptl_cuda_ctx *ctx, cudnnHandle_t h, const ptl_conv2d_plan_opts *o, int strict,
                  cudnnMathType_t mt0)
{
    const int ndirs = o->forward_only ? 1 : 3;
    static const char *names[3] = {"forward", "backward-data", "backward-filter"};
    cand_t cands[3][MAX_CAND];
    int nc[3] = {0, 0, 0}, best[3] = {0, 0, 0};
    size_t wsmax = 0, sz;
    ptl_conv_find_buffers fb = {{NULL, NULL, NULL, NULL}, {NULL, NULL, NULL, NULL}, 0};
    int rc = -1;
    for (int dir = 0; dir < ndirs; dir++) {
        PTL_CHECK(heuristics(p, h, dir, mt0, o, strict, cands[dir], &nc[dir]));
        if (o->find && !strict)  /* the other permitted math: FMA kernels (bf16/fp16), or FMA next to TF32 */
            PTL_CHECK(heuristics(p, h, dir, mt0 == CUDNN_TENSOR_OP_MATH ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH, o,
                                 strict, cands[dir], &nc[dir]));
        if (nc[dir] == 0) {
            no_algo(p, names[dir], o);
            goto fail;
        }
        for (int i = 0; o->find && i < nc[dir]; i++)
            if (cand_workspace(p, h, dir, &cands[dir][i], strict, &sz) == CUDNN_STATUS_SUCCESS && sz > wsmax &&
                (!o->workspace_limit || sz <= o->workspace_limit))
                wsmax = sz;
    }
    if (o->find) {
        PTL_CHECK(ptl_conv_find_buffers_alloc(ctx, &p->d, p->dt, wsmax, &fb));
        for (int dir = 0; dir < ndirs; dir++) {
            const legacy_trial t = {p, h, dir, strict, cands[dir]};
            best[dir] = ptl_conv_find_fastest(ctx, nc[dir], legacy_run, (void *)&t, &fb);
            if (best[dir] < 0) {
                no_algo(p, names[dir], o);
                goto fail;
            }
        }
    }
    for (int dir = 0; dir < ndirs; dir++) {
        const cand_t *c = &cands[dir][best[dir]];
        size_t *ws = dir == DIR_FWD ? &p->ws_f : dir == DIR_BWD_DATA ? &p->ws_bd : &p->ws_bf;
        PTL_CUDNN_TRY(cand_workspace(p, h, dir, c, strict, ws));
        p->tensor_op[dir] = !strict && (is_tensor_op(c->mt) || (p->dt != PTL_FLOAT32 && c->mt == CUDNN_TENSOR_OP_MATH));
        if (dir == DIR_FWD)
            p->af = (cudnnConvolutionFwdAlgo_t)c->algo;
        else if (dir == DIR_BWD_DATA)
            p->abd = (cudnnConvolutionBwdDataAlgo_t)c->algo;
        else
            p->abf = (cudnnConvolutionBwdFilterAlgo_t)c->algo;
    }
    rc = 0;
fail:
    ptl_conv_find_buffers_free(ctx, &fb);
    return rc;
}

extern "C" void ptl_conv2d_plan_retain(ptl_conv2d_plan *p) { __atomic_add_fetch(&p->refs, 1, __ATOMIC_RELAXED); }

extern "C" int ptl_conv2d_plan_refs(const ptl_conv2d_plan *p) { return __atomic_load_n(&p->refs, __ATOMIC_ACQUIRE); }

extern "C" void ptl_conv2d_plan_destroy(ptl_conv2d_plan *p)
{
    if (!p || __atomic_sub_fetch(&p->refs, 1, __ATOMIC_ACQ_REL) > 0)
        return;
    if (p->xd)
        cudnnDestroyTensorDescriptor(p->xd);
    if (p->yd)
        cudnnDestroyTensorDescriptor(p->yd);
    if (p->wd)
        cudnnDestroyFilterDescriptor(p->wd);
    if (p->cf)
        cudnnDestroyConvolutionDescriptor(p->cf);
    if (p->cbd)
        cudnnDestroyConvolutionDescriptor(p->cbd);
    if (p->cbf)
        cudnnDestroyConvolutionDescriptor(p->cbf);
    for (int i = 0; i < PTL_CONV_DIRECTIONS; i++) {
        ptl_cudnn_conv_exec_destroy(p->exec[i]);
        ptl_call_graphs_destroy(p->calls[i]);
    }
    free(p);
}

static int conv_desc_init(cudnnConvolutionDescriptor_t cd, const ptl_conv2d_desc *d, cudnnMathType_t mt)
{
    PTL_CUDNN_TRY(cudnnSetConvolution2dDescriptor(cd, d->pad, d->pad, d->stride, d->stride, 1, 1,
                                                  CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    PTL_CUDNN_TRY(cudnnSetConvolutionGroupCount(cd, d->groups));
    PTL_CUDNN_TRY(cudnnSetConvolutionMathType(cd, mt));
    return 0;
fail:
    return -1;
}

extern "C" int ptl_conv2d_plan_create(ptl_cuda_ctx *ctx, cudnnHandle_t cudnn, const ptl_conv2d_desc *d, ptl_dtype dt,
                                      const ptl_conv2d_plan_opts *opts, ptl_conv2d_plan **out)
{
    const ptl_conv2d_plan_opts defaults = ptl_conv2d_plan_opts_default();
    const ptl_conv2d_plan_opts *o = opts ? opts : &defaults;
    ptl_conv2d_plan *p = NULL;
    cudnnDataType_t ct;
    int strict, on, oc, oh, ow;
    cudnnMathType_t mt0;

    *out = NULL;
    if (dt != PTL_FLOAT32 && dt != PTL_BFLOAT16 && dt != PTL_FLOAT16)
        return ptl_set_error(PTL_ERR_TYPE, "conv2d plan: dtype %s is not supported on CUDA (float32, bfloat16 or "
                             "float16)", ptl_dtype_name(dt));
    if (d->n <= 0 || d->cin <= 0 || d->cout <= 0 || d->groups <= 0 || d->cin % d->groups || d->cout % d->groups ||
        d->ho <= 0 || d->wo <= 0)
        return ptl_set_error(PTL_ERR_VALUE, "conv2d plan: invalid descriptor (use ptl_conv2d_init)");
    p = (ptl_conv2d_plan *)calloc(1, sizeof *p);
    if (!p)
        return ptl_set_error(PTL_ERR_MEMORY, "out of host memory");
    p->d = *d;
    p->dt = dt;
    p->device = ctx->device;
    p->refs = 1;
    p->forward_only = o->forward_only;
    ct = ptl_cudnn_data_type(dt);
    strict = dt == PTL_FLOAT32 && !o->allow_tf32;
    /* FMA math restricts float32 to true float32 kernels. Reduced precision asks for tensor cores
     * explicitly (the heuristics otherwise rank FMA kernels first); TF32 float32 uses the default math,
     * which permits TF32. */
    mt0 = strict ? CUDNN_FMA_MATH : dt == PTL_FLOAT32 ? CUDNN_DEFAULT_MATH : CUDNN_TENSOR_OP_MATH;

    PTL_CUDNN_TRY(cudnnCreateTensorDescriptor(&p->xd));
    PTL_CUDNN_TRY(cudnnCreateTensorDescriptor(&p->yd));
    PTL_CUDNN_TRY(cudnnCreateFilterDescriptor(&p->wd));
    PTL_CUDNN_TRY(cudnnCreateConvolutionDescriptor(&p->cf));
    PTL_CUDNN_TRY(cudnnCreateConvolutionDescriptor(&p->cbd));
    PTL_CUDNN_TRY(cudnnCreateConvolutionDescriptor(&p->cbf));
    PTL_CUDNN_TRY(cudnnSetTensor4dDescriptor(p->xd, CUDNN_TENSOR_NHWC, ct, d->n, d->cin, d->h, d->w));
    PTL_CUDNN_TRY(cudnnSetTensor4dDescriptor(p->yd, CUDNN_TENSOR_NHWC, ct, d->n, d->cout, d->ho, d->wo));
    PTL_CUDNN_TRY(cudnnSetFilter4dDescriptor(p->wd, ct, CUDNN_TENSOR_NHWC, d->cout, d->cin / d->groups, d->k, d->k));
    PTL_CHECK(conv_desc_init(p->cf, d, mt0));
    PTL_CHECK(conv_desc_init(p->cbd, d, mt0));
    PTL_CHECK(conv_desc_init(p->cbf, d, mt0));
    PTL_CUDNN_TRY(cudnnGetConvolution2dForwardOutputDim(p->cf, p->xd, p->wd, &on, &oc, &oh, &ow));
    if (on != d->n || oc != d->cout || oh != d->ho || ow != d->wo) {
        ptl_set_error(PTL_ERR_RUNTIME, "conv2d plan: cuDNN output %dx%dx%dx%d differs from %dx%dx%dx%d", on, oh, ow,
                      oc, d->n, d->ho, d->wo, d->cout);
        goto fail;
    }

    /* A 1x1 stride-1 ungrouped convolution on NHWC data is a GEMM over the pixels; cuBLAS runs it several
     * times faster than the algorithms cuDNN's heuristics pick for it. float32 stays true float32
     * (pedantic compute) unless TF32 is allowed. */
    if (d->k == 1 && d->stride == 1 && d->groups == 1) {
        p->gemm = 1;
        p->gemm_ct = dt != PTL_FLOAT32 ? CUBLAS_COMPUTE_32F
                     : o->allow_tf32   ? CUBLAS_COMPUTE_32F_FAST_TF32
                                       : CUBLAS_COMPUTE_32F_PEDANTIC;
        p->af = (cudnnConvolutionFwdAlgo_t)-1;
        p->abd = (cudnnConvolutionBwdDataAlgo_t)-1;
        p->abf = (cudnnConvolutionBwdFilterAlgo_t)-1;
        p->tensor_op[0] = p->tensor_op[1] = p->tensor_op[2] = dt != PTL_FLOAT32 || o->allow_tf32;
        goto sizes;
    }

    /* cuDNN 9's legacy heuristics take ~0.8 s per depthwise plan (benchmarks/validation.py; ~9 ms for an
     * ungrouped one), several per network shape, and every rectangular validation batch is a new shape.
     * Direct kernels need no query; in float32 they are true float32. */
    if (d->k == DW_K && d->groups == d->cin && d->cin == d->cout) {
        p->depthwise = 1;
        p->af = (cudnnConvolutionFwdAlgo_t)-1;
        p->abd = (cudnnConvolutionBwdDataAlgo_t)-1;
        p->abf = (cudnnConvolutionBwdFilterAlgo_t)-1;
        p->dw_geom = ptl_colsum_geometry((int64_t)d->n * d->ho * d->wo, d->cout, DW_TAPS);
        p->ws_bf = ptl_colsum_part_bytes((int64_t)d->n * d->ho * d->wo, d->cout, DW_TAPS);
        goto sizes;
    }

    if (!o->legacy_api) {
        static const ptl_conv_direction dirs[3] = {PTL_CONV_FORWARD, PTL_CONV_BACKWARD_DATA,
                                                   PTL_CONV_BACKWARD_FILTER};
        size_t *ws[3] = {&p->ws_f, &p->ws_bd, &p->ws_bf};
        const int ndirs = o->forward_only ? 1 : 3;
        int n = 0;
        for (int i = 0; i < ndirs; i++) {
            if (ptl_cudnn_conv_exec_create(ctx, cudnn, d, dt, dirs[i], strict, o, &p->exec[i]))
                goto fail;
            n += p->exec[i] != NULL;
        }
        if (n == ndirs) {
            for (int i = 0; i < ndirs; i++) {
                *ws[i] = ptl_cudnn_conv_exec_workspace(p->exec[i]);
                p->tensor_op[i] = ptl_cudnn_conv_exec_tensor_op(p->exec[i]);
            }
            p->af = (cudnnConvolutionFwdAlgo_t)ptl_cudnn_conv_exec_engine(p->exec[0]);
            p->abd = (cudnnConvolutionBwdDataAlgo_t)(p->exec[1] ? ptl_cudnn_conv_exec_engine(p->exec[1]) : -1);
            p->abf = (cudnnConvolutionBwdFilterAlgo_t)(p->exec[2] ? ptl_cudnn_conv_exec_engine(p->exec[2]) : -1);
            /* optional: without it, adding runs the overwriting plan into the caller's scratch and an add */
            if (!o->forward_only &&
                ptl_cudnn_conv_exec_create(ctx, cudnn, d, dt, PTL_CONV_BACKWARD_DATA_ADD, strict, o,
                                           &p->exec[PTL_CONV_BACKWARD_DATA_ADD]))
                goto fail;
            if (p->exec[PTL_CONV_BACKWARD_DATA_ADD] &&
                ptl_cudnn_conv_exec_workspace(p->exec[PTL_CONV_BACKWARD_DATA_ADD]) > p->ws_bd)
                p->ws_bd = ptl_cudnn_conv_exec_workspace(p->exec[PTL_CONV_BACKWARD_DATA_ADD]);
            goto sizes;
        }
        for (int i = 0; i < ndirs; i++) { /* an engine missing for one direction: all of them go legacy */
            ptl_cudnn_conv_exec_destroy(p->exec[i]);
            p->exec[i] = NULL;
        }
    }
    if (choose(p, ctx, cudnn, o, strict, mt0))
        goto fail;

sizes:
    /* cuDNN has no tensor-core engine for a 3-channel input (the stem): its generic forward was twice as slow as
     * a direct kernel, its weight gradient (a channel padding and a split-K GEMM) three times slower */
    if (!p->gemm && !p->depthwise && ptl_conv2d_narrow_takes(d)) {
        p->narrow = 1;
        p->af = (cudnnConvolutionFwdAlgo_t)-1;
        p->ws_f = 0;
        if (!o->forward_only && ptl_conv2d_narrow_wgrad_takes(d, dt)) {
            p->narrow_wgrad = 1;
            p->abf = (cudnnConvolutionBwdFilterAlgo_t)-1;
            p->tensor_op[2] = 1;
            p->ws_bf = ptl_conv2d_narrow_wgrad_workspace(d);
        }
    }
    if (!p->depthwise)
        for (int i = 0; i < (o->forward_only ? 1 : PTL_CONV_DIRECTIONS); i++)
            if (!(p->calls[i] = ptl_call_graphs_create(CALL_KEYS)))
                goto fail;
    if (o->forward_only) {
        p->ws_bd = p->ws_bf = 0;
    } else {
        const int64_t rows = (int64_t)d->n * d->ho * d->wo;
        p->bias_geom = ptl_colsum_geometry(rows, d->cout, 1);
        p->ws_bias = ptl_colsum_part_bytes(rows, d->cout, 1);
    }
    p->ws = p->ws_f;
    if (p->ws_bd > p->ws)
        p->ws = p->ws_bd;
    if (p->ws_bf > p->ws)
        p->ws = p->ws_bf;
    if (p->ws_bias > p->ws)
        p->ws = p->ws_bias;
    *out = p;
    return 0;
fail:
    ptl_conv2d_plan_destroy(p);
    return -1;
}

extern "C" const ptl_conv2d_desc *ptl_conv2d_plan_desc(const ptl_conv2d_plan *p) { return &p->d; }
extern "C" ptl_dtype ptl_conv2d_plan_dtype(const ptl_conv2d_plan *p) { return p->dt; }
extern "C" size_t ptl_conv2d_plan_workspace(const ptl_conv2d_plan *p) { return p->ws; }

extern "C" size_t ptl_conv2d_plan_param_grads_workspace(const ptl_conv2d_plan *p)
{
    return p->ws_bf > p->ws_bias ? p->ws_bf : p->ws_bias;
}

extern "C" size_t ptl_conv2d_plan_data_workspace(const ptl_conv2d_plan *p)
{
    return p->ws_f > p->ws_bd ? p->ws_f : p->ws_bd;
}

extern "C" const char *ptl_conv2d_plan_path(const ptl_conv2d_plan *p)
{
    return p->gemm ? "cublas" : p->depthwise ? "direct" : p->exec[0] ? "cudnn-graph" : "cudnn-legacy";
}

extern "C" void ptl_conv2d_plan_algos(const ptl_conv2d_plan *p, int algo[3], int tensor_op[3])
{
    algo[0] = (int)p->af;
    algo[1] = (int)p->abd;
    algo[2] = (int)p->abf;
    for (int i = 0; i < 3; i++)
        tensor_op[i] = p->tensor_op[i];
}

static cudaDataType gemm_type(ptl_dtype dt)
{
    return dt == PTL_FLOAT32 ? CUDA_R_32F : dt == PTL_BFLOAT16 ? CUDA_R_16BF : CUDA_R_16F;
}

/* Column-major C (m x n) = alpha op(A) op(B) + beta C, all of the plan's dtype. With M pixels, X (M, cin),
 * Y (M, cout) and W (cout, cin) row-major, i.e. column-major Xc (cin x M), Yc (cout x M), Wc (cin x cout):
 *   Yc = Wc^T Xc,   dXc = Wc dYc,   dWc += Xc dYc^T. */
static int gemm(ptl_cuda_ctx *ctx, const ptl_conv2d_plan *p, cublasOperation_t ta, cublasOperation_t tb, int m,
                int n, int k, const void *A, int lda, const void *B, int ldb, float beta, void *C, int ldc)
{
    const float one = 1.0f;
    const cudaDataType t = gemm_type(p->dt);
    PTL_CUBLAS_TRY(cublasGemmEx(ctx->cublas, ta, tb, m, n, k, &one, A, t, lda, B, t, ldb, &beta, C, t, ldc,
                                p->gemm_ct, CUBLAS_GEMM_DEFAULT));
    return 0;
fail:
    return -1;
}

/* backward: the call is one of the backward directions, which a forward-only plan lacks */
static int check_exec(const char *fn, ptl_cuda_ctx *ctx, const ptl_conv2d_plan *p, int backward, size_t need,
                      size_t have)
{
    if (backward && p->forward_only)
        return ptl_set_error(PTL_ERR_VALUE, "%s: the plan was made for forwards only (forward_only)", fn);
    if (ctx->device != p->device)
        return ptl_set_error(PTL_ERR_VALUE, "%s: plan was made for cuda:%d, called on cuda:%d", fn, p->device,
                             ctx->device);
    if (have < need)
        return ptl_set_error(PTL_ERR_VALUE, "%s: workspace of %zu bytes is smaller than the plan's %zu", fn, have,
                             need);
    return 0;
}

/* One direction's library call (cuBLAS for 1x1, else cuDNN) on the tensors in the direction's variant-pack
 * order (conv2d_cudnn_graph.h): forward (x, w, y), backward data (dx, w, dy), backward filter (x, dw, dy). */
typedef struct {
    ptl_cuda_ctx *ctx;
    const ptl_conv2d_plan *p;
    ptl_conv_direction dir;
    const void *a, *b, *c;
    void *workspace;
    size_t workspace_bytes;
} library_call;

static int issue_library_call(void *arg)
{
    const library_call *k = (const library_call *)arg;
    ptl_cuda_ctx *ctx = k->ctx;
    const ptl_conv2d_plan *p = k->p;
    const ptl_conv2d_desc *d = &p->d;
    const int64_t pixels_in = (int64_t)d->n * d->h * d->w;
    const float one = 1.0f, zero = 0.0f;
    void *a = (void *)k->a, *b = (void *)k->b, *c = (void *)k->c;
    if (p->exec[k->dir])
        return ptl_cudnn_conv_exec_run(ctx, p->exec[k->dir], a, b, c, k->workspace);
    switch (k->dir) {
    case PTL_CONV_FORWARD:
        if (p->gemm)
            return gemm(ctx, p, CUBLAS_OP_T, CUBLAS_OP_N, d->cout, (int)pixels_in, d->cin, b, d->cin, a, d->cin, 0.0f,
                        c, d->cout);
        PTL_CUDNN_TRY(cudnnConvolutionForward(ctx->cudnn, &one, p->xd, a, p->wd, b, p->cf, p->af, k->workspace,
                                              k->workspace_bytes, &zero, p->yd, c));
        return 0;
    case PTL_CONV_BACKWARD_DATA:
    case PTL_CONV_BACKWARD_DATA_ADD: {
        const float beta = k->dir == PTL_CONV_BACKWARD_DATA_ADD ? 1.0f : 0.0f;
        if (p->gemm)
            return gemm(ctx, p, CUBLAS_OP_N, CUBLAS_OP_N, d->cin, (int)pixels_in, d->cout, b, d->cin, c, d->cout, beta,
                        a, d->cin);
        PTL_CUDNN_TRY(cudnnConvolutionBackwardData(ctx->cudnn, &one, p->wd, b, p->yd, c, p->cbd, p->abd, k->workspace,
                                                   k->workspace_bytes, &beta, p->xd, a));
        return 0;
    }
    case PTL_CONV_BACKWARD_FILTER:
        if (p->gemm)
            return gemm(ctx, p, CUBLAS_OP_N, CUBLAS_OP_T, d->cin, d->cout, (int)pixels_in, a, d->cin, c, d->cout, 1.0f,
                        b, d->cin);
        PTL_CUDNN_TRY(cudnnConvolutionBackwardFilter(ctx->cudnn, &one, p->xd, a, p->yd, c, p->cbf, p->abf,
                                                     k->workspace, k->workspace_bytes, &one, p->wd, b));
        return 0;
    }
fail:
    return -1;
}

/* The call, or the graph recorded from it when the same pointers come again on the same queue. */
static int run_library_call(const library_call *k)
{
    const ptl_call_key key = {{k->ctx, k->a, k->b, k->c, k->workspace, (const void *)(uintptr_t)k->workspace_bytes}};
    return ptl_call_graph_run(k->p->calls[k->dir], k->ctx->stream, &key, issue_library_call, (void *)k);
}

template <typename T, typename I>
__global__ void bias_add_kernel(I total, int c, const T *bias, T *y)
{
    ptl_wait_prior();
    const I stride = (I)gridDim.x * blockDim.x;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride)
        ptl_st(y + i, ptl_ld(y + i) + ptl_ld(bias + (int)(i % c)));
}

template <typename T>
struct bias_grad_op {
    static constexpr int K = 1;
    static constexpr int ROWS_AT_ONCE = 1;
    typedef T Row;
    const T *dy;
    int c;
    __device__ Row load(int64_t r, int ch) const { return dy[r * c + ch]; }
    __device__ void add(const Row &v, int, double *acc) const { acc[0] += (double)ptl_ld(&v); }
};

template <typename T>
__global__ void bias_grad_finish(int c, int nchunks, const double *part, T *db)
{
    ptl_wait_prior();
    const int ch = ptl_colsum_finish_channel();
    if (ch >= c)
        return;
    const float db0 = ptl_ld(db + ch); /* loaded before the sums, so that its latency hides behind theirs */
    const double s = ptl_colsum_finish(part, nchunks, c, 0, ch);
    if ((threadIdx.x & 31) == 0)
        ptl_st(db + ch, (float)((double)db0 + s));
}

/* ---------------------------------------------------------------- depthwise 3x3
 * One thread per output (forward) or input (backward-input) element, the taps summed in float32 in
 * row-major tap order; the weight gradient is a per-channel sum over output pixels of 9 products, by the
 * deterministic column reduction (double partial sums, fixed order). Weights are OHWI with one input
 * channel: w[ch * 9 + ky * 3 + kx]. */
template <typename T, typename I, int V>
__global__ void dw_forward_kernel(I groups, ptl_conv2d_desc d, const T *x, const T *w, T *y)
{
    ptl_wait_prior();
    typedef ptl_pack<T, V> P;
    const I stride = (I)gridDim.x * blockDim.x;
    const int cg = d.cout / V;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < groups; i += stride) {
        const int ch0 = (int)(i % cg) * V;
        I pix = i / cg;
        const int ox = (int)(pix % d.wo);
        pix /= d.wo;
        const int oy = (int)(pix % d.ho);
        const I b = pix / d.ho;
        float acc[V];
#pragma unroll
        for (int k = 0; k < V; k++)
            acc[k] = 0.0f;
        for (int ky = 0; ky < DW_K; ky++) {
            const int iy = oy * d.stride + ky - d.pad;
            if (iy < 0 || iy >= d.h)
                continue;
            for (int kx = 0; kx < DW_K; kx++) {
                const int ix = ox * d.stride + kx - d.pad;
                if (ix < 0 || ix >= d.w)
                    continue;
                const P xv = reinterpret_cast<const P *>(x + ((b * d.h + iy) * d.w + ix) * d.cout + ch0)[0];
#pragma unroll
                for (int k = 0; k < V; k++)
                    acc[k] += ptl_ld(&xv.v[k]) * ptl_ld(w + (ch0 + k) * DW_TAPS + ky * DW_K + kx);
            }
        }
        P yv;
#pragma unroll
        for (int k = 0; k < V; k++)
            ptl_st(&yv.v[k], acc[k]);
        reinterpret_cast<P *>(y)[i] = yv;
    }
}

/* ADD: dx += the gradient (rounded once, from the float sum) instead of dx = it */
template <typename T, typename I, int V, bool ADD>
__device__ void dw_backward_input(I groups, const ptl_conv2d_desc &d, const T *dy, const T *w, T *dx)
{
    typedef ptl_pack<T, V> P;
    const I stride = (I)gridDim.x * blockDim.x;
    const int cg = d.cin / V;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < groups; i += stride) {
        const int ch0 = (int)(i % cg) * V;
        I pix = i / cg;
        const int ix = (int)(pix % d.w);
        pix /= d.w;
        const int iy = (int)(pix % d.h);
        const I b = pix / d.h;
        float acc[V];
#pragma unroll
        for (int k = 0; k < V; k++)
            acc[k] = 0.0f;
        for (int ky = 0; ky < DW_K; ky++) {
            const int ty = iy + d.pad - ky; /* = oy * stride */
            if (ty < 0 || ty % d.stride || ty / d.stride >= d.ho)
                continue;
            const int oy = ty / d.stride;
            for (int kx = 0; kx < DW_K; kx++) {
                const int tx = ix + d.pad - kx;
                if (tx < 0 || tx % d.stride || tx / d.stride >= d.wo)
                    continue;
                const P gv = reinterpret_cast<const P *>(dy + ((b * d.ho + oy) * d.wo + tx / d.stride) * d.cin + ch0)[0];
#pragma unroll
                for (int k = 0; k < V; k++)
                    acc[k] += ptl_ld(&gv.v[k]) * ptl_ld(w + (ch0 + k) * DW_TAPS + ky * DW_K + kx);
            }
        }
        P xv;
        if (ADD) {
            xv = reinterpret_cast<const P *>(dx)[i];
#pragma unroll
            for (int k = 0; k < V; k++)
                acc[k] += ptl_ld(&xv.v[k]);
        }
#pragma unroll
        for (int k = 0; k < V; k++)
            ptl_st(&xv.v[k], acc[k]);
        reinterpret_cast<P *>(dx)[i] = xv;
    }
}

template <typename T, typename I, int V>
__global__ void dw_backward_input_kernel(I groups, ptl_conv2d_desc d, const T *dy, const T *w, T *dx)
{
    ptl_wait_prior();
    dw_backward_input<T, I, V, false>(groups, d, dy, w, dx);
}

template <typename T, typename I, int V>
__global__ void dw_backward_input_add_kernel(I groups, ptl_conv2d_desc d, const T *dy, const T *w, T *dx)
{
    ptl_wait_prior();
    dw_backward_input<T, I, V, true>(groups, d, dy, w, dx);
}

/* I: the pixel index's type, 32-bit where both activations' sizes fit (its divisions are several times
 * cheaper than 64-bit ones). */
template <typename T, typename I>
struct dw_grad_op {
    static constexpr int K = DW_TAPS;
    static constexpr int ROWS_AT_ONCE = 2;
    /* dy's value and the taps' x values, `inside` bit k set where tap k lies in the image */
    struct Row {
        T g, xs[DW_TAPS];
        unsigned inside;
    };
    const T *x, *dy;
    ptl_conv2d_desc d;
    __device__ Row load(int64_t row, int ch) const
    {
        const I r = (I)row, c = (I)d.cout;
        const int ox = (int)(r % (I)d.wo);
        const I t = r / (I)d.wo;
        const int oy = (int)(t % (I)d.ho);
        const I b = t / (I)d.ho;
        Row v;
        v.g = dy[r * c + ch];
        v.inside = 0;
#pragma unroll
        for (int ky = 0; ky < DW_K; ky++)
#pragma unroll
            for (int kx = 0; kx < DW_K; kx++) {
                const int iy = oy * d.stride + ky - d.pad, ix = ox * d.stride + kx - d.pad;
                const bool in = iy >= 0 && iy < d.h && ix >= 0 && ix < d.w;
                /* outside: v.g, any value (add skips the tap) */
                v.xs[ky * DW_K + kx] = in ? x[((b * (I)d.h + iy) * (I)d.w + ix) * c + ch] : v.g;
                v.inside |= (unsigned)in << (ky * DW_K + kx);
            }
        return v;
    }
    __device__ void add(const Row &v, int ch, double *acc) const
    {
        const double g = (double)ptl_ld(&v.g);
#pragma unroll
        for (int k = 0; k < DW_TAPS; k++)
            if (v.inside >> k & 1u)
                acc[k] += g * (double)ptl_ld(&v.xs[k]);
    }
};

/* One warp per (channel, tap): the nine sums of a channel are independent, and one warp doing them in turn
 * made this finish a chain of nine latency-bound reductions. */
template <typename T>
__global__ void dw_grad_finish(int c, int nchunks, const double *part, T *dw)
{
    ptl_wait_prior();
    const int item = ptl_colsum_finish_channel(); /* ch * DW_TAPS + q: dw's own layout */
    if (item >= c * DW_TAPS)
        return;
    const int ch = item / DW_TAPS, q = item % DW_TAPS;
    const float dw0 = ptl_ld(dw + item); /* as in bias_grad_finish */
    const double s = ptl_colsum_finish(part, nchunks, c, q, ch);
    if ((threadIdx.x & 31) == 0)
        ptl_st(dw + item, (float)((double)dw0 + s));
}

/* Launches kernel<T, I, V> over `total` elements, V channels per thread (a 16-byte pack when the channel
 * count and the pointers allow it), with 32-bit indices when both activations' sizes fit. */
#define DW_LAUNCH_V(kernel, p, total, V, ...)                                                                     \
    do {                                                                                                          \
        const int64_t groups_ = (total) / (V);                                                                    \
        if (ptl_conv2d_int32_ok(&(p)->d))                                                                         \
            ptl_launch(kernel<T, int, V>, ptl_grid_for(groups_, 256), 256, 0, ctx->stream, (int)groups_,          \
                       __VA_ARGS__);                                                                              \
        else                                                                                                      \
            ptl_launch(kernel<T, int64_t, V>, ptl_grid_for(groups_, 256), 256, 0, ctx->stream, groups_,           \
                       __VA_ARGS__);                                                                              \
    } while (0)
#define DW_LAUNCH(fn, kernel, p, total, a, b, out)                                                                \
    do {                                                                                                          \
        PTL_LAYER_DISPATCH(fn, (p)->dt, {                                                                         \
            if (ptl_vec_ok((p)->d.cout, 16 / sizeof(T), a, out, out))                                            \
                DW_LAUNCH_V(kernel, p, total, 16 / sizeof(T), (p)->d, (const T *)(a), (const T *)(b), (T *)(out)); \
            else                                                                                                  \
                DW_LAUNCH_V(kernel, p, total, 1, (p)->d, (const T *)(a), (const T *)(b), (T *)(out));             \
        });                                                                                                       \
        PTL_LAUNCH_CHECK(#kernel);                                                                                \
    } while (0)

extern "C" int ptl_conv2d_forward_cuda(ptl_cuda_ctx *ctx, const ptl_conv2d_plan *p, const void *x, const void *w,
                                       const void *bias, void *y, void *workspace, size_t workspace_bytes)
{
    const int64_t total = (int64_t)p->d.n * p->d.ho * p->d.wo * p->d.cout;
    if (check_exec("conv2d_forward_cuda", ctx, p, 0, p->ws_f, workspace_bytes))
        return -1;
    if (p->depthwise) {
        DW_LAUNCH("conv2d_forward_cuda", dw_forward_kernel, p, total, x, w, y);
    } else if (p->narrow) {
        if (ptl_conv2d_narrow_forward(ctx->stream, "conv2d_forward_cuda", p->dt, &p->d, x, w, y))
            return -1;
    } else {
        const library_call k = {ctx, p, PTL_CONV_FORWARD, x, w, y, workspace, workspace_bytes};
        if (run_library_call(&k))
            return -1;
    }
    if (bias) {
        if (total < INT32_MAX)
            PTL_LAYER_DISPATCH("conv2d_forward_cuda", p->dt,
                               ptl_launch(bias_add_kernel<T, int>, ptl_grid_for(total, 256), 256, 0, ctx->stream,
                                          (int)total, p->d.cout, (const T *)bias, (T *)y));
        else
            PTL_LAYER_DISPATCH("conv2d_forward_cuda", p->dt,
                               ptl_launch(bias_add_kernel<T, int64_t>, ptl_grid_for(total, 256), 256, 0, ctx->stream,
                                          total, p->d.cout, (const T *)bias, (T *)y));
        PTL_LAUNCH_CHECK("bias_add_kernel");
    }
    return 0;
fail:
    return -1;
}

/* dx = dL/dx, or with add dx += dL/dx in the same call (a plan that adds_in_place) */
static int backward_input(ptl_cuda_ctx *ctx, const ptl_conv2d_plan *p, const void *dy, const void *w, void *dx,
                          int add, void *workspace, size_t workspace_bytes)
{
    const char *fn = add ? "conv2d_backward_input_add_cuda" : "conv2d_backward_input_cuda";
    if (check_exec(fn, ctx, p, 1, p->ws_bd, workspace_bytes))
        return -1;
    if (p->depthwise) {
        const int64_t total = (int64_t)p->d.n * p->d.h * p->d.w * p->d.cin;
        if (add)
            DW_LAUNCH(fn, dw_backward_input_add_kernel, p, total, dy, w, dx);
        else
            DW_LAUNCH(fn, dw_backward_input_kernel, p, total, dy, w, dx);
        return 0;
    }
    {
        const ptl_conv_direction dir = add ? PTL_CONV_BACKWARD_DATA_ADD : PTL_CONV_BACKWARD_DATA;
        const library_call k = {ctx, p, dir, dx, w, dy, workspace, workspace_bytes};
        return run_library_call(&k);
    }
fail:
    return -1;
}

extern "C" int ptl_conv2d_backward_input_cuda(ptl_cuda_ctx *ctx, const ptl_conv2d_plan *p, const void *dy,
                                              const void *w, void *dx, void *workspace, size_t workspace_bytes)
{
    return backward_input(ctx, p, dy, w, dx, 0, workspace, workspace_bytes);
}

/* Whether backward data adds to dx in one call: cuBLAS and the legacy API through beta, the direct kernel,
 * or a graph-API plan made for adding. */
static int adds_in_place(const ptl_conv2d_plan *p)
{
    return p->gemm || p->depthwise || !p->exec[PTL_CONV_FORWARD] || p->exec[PTL_CONV_BACKWARD_DATA_ADD];
}

extern "C" int ptl_conv2d_plan_adds_input_grad(const ptl_conv2d_plan *p) { return adds_in_place(p); }

extern "C" int ptl_conv2d_backward_input_add_cuda(ptl_cuda_ctx *ctx, const ptl_conv2d_plan *p, const void *dy,
                                                  const void *w, void *dx, void *scratch, void *workspace,
                                                  size_t workspace_bytes)
{
    if (check_exec("conv2d_backward_input_add_cuda", ctx, p, 1, p->ws_bd, workspace_bytes))
        return -1;
    if (adds_in_place(p))
        return backward_input(ctx, p, dy, w, dx, 1, workspace, workspace_bytes);
    if (!scratch)
        return ptl_set_error(PTL_ERR_VALUE, "conv2d_backward_input_add_cuda: the plan adds through a scratch buffer "
                                            "of dx's size, and none was given");
    return backward_input(ctx, p, dy, w, scratch, 0, workspace, workspace_bytes) ||
           ptl_accumulate_cuda(ctx, p->dt, (int64_t)p->d.n * p->d.h * p->d.w * p->d.cin, scratch, dx);
}

extern "C" int ptl_conv2d_backward_weight_cuda(ptl_cuda_ctx *ctx, const ptl_conv2d_plan *p, const void *x,
                                               const void *dy, void *dw, void *workspace, size_t workspace_bytes)
{
    if (check_exec("conv2d_backward_weight_cuda", ctx, p, 1, p->ws_bf, workspace_bytes))
        return -1;
    if (p->depthwise) {
        const int64_t rows = (int64_t)p->d.n * p->d.ho * p->d.wo;
        const int c = p->d.cout;
        double *part = (double *)workspace;
        PTL_LAYER_DISPATCH("conv2d_backward_weight_cuda", p->dt, {
            if (ptl_conv2d_int32_ok(&(p)->d))
                ptl_colsum_launch(p->dw_geom, rows, c, dw_grad_op<T, int>{(const T *)x, (const T *)dy, p->d}, part,
                                  ctx->stream);
            else
                ptl_colsum_launch(p->dw_geom, rows, c, dw_grad_op<T, int64_t>{(const T *)x, (const T *)dy, p->d},
                                  part, ctx->stream);
            PTL_LAUNCH_CHECK("dw_grad_partials");
            ptl_launch(dw_grad_finish<T>, ptl_colsum_finish_blocks(c * DW_TAPS), PTL_COLSUM_FINISH_THREADS, 0,
                       ctx->stream, c, p->dw_geom.nchunks, part, (T *)dw);
            PTL_LAUNCH_CHECK("dw_grad_finish");
        });
        return 0;
    }
    if (p->narrow_wgrad)
        return ptl_conv2d_narrow_backward_weight(ctx->stream, "conv2d_backward_weight_cuda", p->dt, &p->d, x, dy, dw,
                                                 workspace, workspace_bytes);
    {
        const library_call k = {ctx, p, PTL_CONV_BACKWARD_FILTER, x, dw, dy, workspace, workspace_bytes};
        return run_library_call(&k);
    }
fail:
    return -1;
}

extern "C" int ptl_conv2d_plan_warm(ptl_cuda_ctx *ctx, const ptl_conv2d_plan *p, void *a, void *b, void *c,
                                    void *workspace, size_t workspace_bytes)
{
    if (workspace_bytes < p->ws)
        return ptl_set_error(PTL_ERR_VALUE, "conv2d plan warm-up: workspace of %zu bytes is smaller than the plan's %zu",
                             workspace_bytes, p->ws);
    if (ptl_conv2d_forward_cuda(ctx, p, a, b, NULL, c, workspace, workspace_bytes))
        return -1;
    if (p->forward_only)
        return 0;
    if (ptl_conv2d_backward_input_cuda(ctx, p, c, b, a, workspace, workspace_bytes) ||
        ptl_conv2d_backward_weight_cuda(ctx, p, a, c, b, workspace, workspace_bytes) ||
        ptl_conv2d_backward_bias_cuda(ctx, p, c, b, workspace, workspace_bytes))
        return -1;
    return 0;
}

extern "C" int ptl_conv2d_backward_bias_cuda(ptl_cuda_ctx *ctx, const ptl_conv2d_plan *p, const void *dy,
                                             void *dbias, void *workspace, size_t workspace_bytes)
{
    const int64_t rows = (int64_t)p->d.n * p->d.ho * p->d.wo;
    const int c = p->d.cout;
    const ptl_colsum_geom g = p->bias_geom;
    double *part = (double *)workspace;
    if (check_exec("conv2d_backward_bias_cuda", ctx, p, 1, p->ws_bias, workspace_bytes))
        return -1;
    PTL_LAYER_DISPATCH("conv2d_backward_bias_cuda", p->dt, {
        ptl_colsum_launch(g, rows, c, bias_grad_op<T>{(const T *)dy, c}, part, ctx->stream);
        PTL_LAUNCH_CHECK("bias_grad_partials");
        ptl_launch(bias_grad_finish<T>, ptl_colsum_finish_blocks(c), PTL_COLSUM_FINISH_THREADS, 0, ctx->stream, c,
                   g.nchunks, part, (T *)dbias);
        PTL_LAUNCH_CHECK("bias_grad_finish");
    });
    return 0;
fail:
    return -1;
}
