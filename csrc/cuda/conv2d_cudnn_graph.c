/* Convolution directions as cuDNN backend API execution plans (conv2d_cudnn_graph.h). */
#include <stdlib.h>

#include "conv2d_cudnn_graph.h"
#include "conv2d_find.h"
#include "device.h"

/* The handle attributes of the operation graph and the execution plan are deprecated in cuDNN 9 in favour
 * of device-property descriptors, which older cuDNN 9 libraries lack; the handle works on all of them. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#define UID_A 1
#define UID_B 2
#define UID_C 3
#define MAX_CFGS 64

struct ptl_cudnn_conv_exec {
    cudnnBackendDescriptor_t plan;
    size_t workspace;
    int engine, tensor_op;
};

typedef cudnnBackendDescriptor_t bdesc;

static int set(bdesc d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t n,
               const void *v)
{
    PTL_CUDNN_TRY(cudnnBackendSetAttribute(d, name, type, n, v));
    return 0;
fail:
    return -1;
}

static int set_desc(bdesc d, cudnnBackendAttributeName_t name, bdesc v)
{
    return set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}

static void drop(bdesc *d)
{
    if (*d)
        cudnnBackendDestroyDescriptor(*d);
    *d = NULL;
}

/* A finalized NHWC tensor (or KRSC filter) of logical dims (n, c, h, w). */
static int tensor(int64_t uid, cudnnDataType_t dt, int64_t n, int64_t c, int64_t h, int64_t w, bdesc *out)
{
    const int64_t dims[4] = {n, c, h, w}, strides[4] = {h * w * c, 1, w * c, c}, align = 16;
    PTL_CUDNN_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, out));
    PTL_CHECK(set(*out, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt));
    PTL_CHECK(set(*out, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims));
    PTL_CHECK(set(*out, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides));
    PTL_CHECK(set(*out, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
    PTL_CHECK(set(*out, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align));
    PTL_CUDNN_TRY(cudnnBackendFinalize(*out));
    return 0;
fail:
    drop(out);
    return -1;
}

static int conv_desc(const ptl_conv2d_desc *d, bdesc *out)
{
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    const int64_t dims = 2, one[2] = {1, 1}, stride[2] = {d->stride, d->stride}, pad[2] = {d->pad, d->pad};
    PTL_CUDNN_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, out));
    PTL_CHECK(set(*out, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp));
    PTL_CHECK(set(*out, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode));
    PTL_CHECK(set(*out, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims));
    PTL_CHECK(set(*out, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, one));
    PTL_CHECK(set(*out, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride));
    PTL_CHECK(set(*out, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad));
    PTL_CHECK(set(*out, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad));
    PTL_CUDNN_TRY(cudnnBackendFinalize(*out));
    return 0;
fail:
    drop(out);
    return -1;
}

/* cuDNN 9's NOT_SUPPORTED family (3000-3999): the problem, not a failure. */
static int not_supported(cudnnStatus_t st) { return st >= CUDNN_STATUS_NOT_SUPPORTED && st < 4000; }

/* The operation of `dir` over tensors a (x or dx), b (w or dw), c (y or dy); 1 (and no operation) when
 * cuDNN does not support it. */
static int operation(ptl_conv_direction dir, bdesc a, bdesc b, bdesc c, bdesc conv, bdesc *out)
{
    static const cudnnBackendDescriptorType_t type[3] = {
        CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
        CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
        CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR};
    static const cudnnBackendAttributeName_t attr[3][6] = {
        {CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA},
        {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA},
        {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA}};
    const int k = dir == PTL_CONV_BACKWARD_DATA_ADD ? PTL_CONV_BACKWARD_DATA : dir;
    const float alpha = 1.0f, beta = dir == PTL_CONV_FORWARD || dir == PTL_CONV_BACKWARD_DATA ? 0.0f : 1.0f;
    cudnnStatus_t st;
    PTL_CUDNN_TRY(cudnnBackendCreateDescriptor(type[k], out));
    PTL_CHECK(set_desc(*out, attr[k][0], a));
    PTL_CHECK(set_desc(*out, attr[k][1], b));
    PTL_CHECK(set_desc(*out, attr[k][2], c));
    PTL_CHECK(set_desc(*out, attr[k][3], conv));
    PTL_CHECK(set(*out, attr[k][4], CUDNN_TYPE_FLOAT, 1, &alpha));
    PTL_CHECK(set(*out, attr[k][5], CUDNN_TYPE_FLOAT, 1, &beta));
    st = cudnnBackendFinalize(*out);
    if (not_supported(st)) {
        drop(out);
        return 1;
    }
    PTL_CUDNN_TRY(st);
    return 0;
fail:
    drop(out);
    return -1;
}

/* Whether the engine of cfg meets the options; its global index and tensor-core use. -1: cuDNN error. */
static int engine_allowed(bdesc cfg, int strict, const ptl_conv2d_plan_opts *o, int *index, int *tensor_op)
{
    bdesc eng = NULL;
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    cudnnBackendBehaviorNote_t behav[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
    int64_t nn = 0, nb = 0, gi = -1, got = 0;
    int ok = 1;
    PTL_CUDNN_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng));
    PTL_CUDNN_TRY(cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got,
                                           &eng));
    PTL_CUDNN_TRY(cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                           CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &nn, notes));
    PTL_CUDNN_TRY(cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                                           CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &nb, behav));
    PTL_CUDNN_TRY(cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &got, &gi));
    *tensor_op = 0;
    for (int64_t i = 0; i < nn; i++) {
        if (notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE)
            *tensor_op = 1;
        if ((notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC && o->deterministic) ||
            notes[i] == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION ||
            (strict && (notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE ||
                        notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)))
            ok = 0;
    }
    for (int64_t i = 0; i < nb; i++)
        if (behav[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION)
            ok = 0;
    *index = (int)gi;
    drop(&eng);
    return ok;
fail:
    drop(&eng);
    return -1;
}

/* An execution plan for cfg; NULL in *out (and 0) when cuDNN refuses to finalize it for this problem. */
static int make_plan(cudnnHandle_t h, bdesc cfg, bdesc *out, size_t *workspace)
{
    int64_t ws = 0, got = 0;
    cudnnStatus_t st;
    PTL_CUDNN_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, out));
    PTL_CHECK(set(*out, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h));
    PTL_CHECK(set_desc(*out, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg));
    st = cudnnBackendFinalize(*out);
    if (st != CUDNN_STATUS_SUCCESS) {
        drop(out);
        return 0;
    }
    PTL_CUDNN_TRY(cudnnBackendGetAttribute(*out, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got,
                                           &ws));
    *workspace = (size_t)ws;
    return 0;
fail:
    drop(out);
    return -1;
}

static int execute(cudnnHandle_t h, bdesc plan, const void *a, const void *b, const void *c, void *workspace)
{
    bdesc vp = NULL;
    const int64_t uids[3] = {UID_A, UID_B, UID_C};
    void *ptrs[3] = {(void *)a, (void *)b, (void *)c};
    PTL_CUDNN_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp));
    PTL_CHECK(set(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids));
    PTL_CHECK(set(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs));
    PTL_CHECK(set(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace));
    PTL_CUDNN_TRY(cudnnBackendFinalize(vp));
    PTL_CUDNN_TRY(cudnnBackendExecute(h, plan, vp));
    drop(&vp);
    return 0;
fail:
    drop(&vp);
    return -1;
}

/* One timed run of candidate plan i (the find option). */
typedef struct {
    cudnnHandle_t h;
    bdesc *plans;
} graph_trial;

static int graph_run(void *arg, int i, const ptl_conv_find_buffers *b)
{
    const graph_trial *t = (const graph_trial *)arg;
    return execute(t->h, t->plans[i], b->buf[0], b->buf[1], b->buf[2], b->buf[3]);
}

int ptl_cudnn_conv_exec_create(ptl_cuda_ctx *ctx, cudnnHandle_t cudnn, const ptl_conv2d_desc *d, ptl_dtype dt,
                               ptl_conv_direction dir, int strict, const ptl_conv2d_plan_opts *o,
                               ptl_cudnn_conv_exec **out)
{
    const cudnnDataType_t ct = ptl_cudnn_data_type(dt);
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    bdesc ta = NULL, tb = NULL, tc = NULL, conv = NULL, op = NULL, graph = NULL, heur = NULL;
    bdesc cfgs[MAX_CFGS] = {NULL}, plans[PTL_CUDNN_GRAPH_FIND] = {NULL};
    size_t ws[PTL_CUDNN_GRAPH_FIND];
    int engines[PTL_CUDNN_GRAPH_FIND], tops[PTL_CUDNN_GRAPH_FIND];
    int64_t ncfg = 0;
    int nplans = 0, pick = 0, made, rc = -1;
    cudnnStatus_t st;
    const int want = o->find ? PTL_CUDNN_GRAPH_FIND : 1;
    ptl_cudnn_conv_exec *e = NULL;
    ptl_conv_find_buffers fb = {{NULL}, {NULL}, 0};

    *out = NULL;
    PTL_CHECK(tensor(UID_A, ct, d->n, d->cin, d->h, d->w, &ta));
    PTL_CHECK(tensor(UID_B, ct, d->cout, d->cin / d->groups, d->k, d->k, &tb));
    PTL_CHECK(tensor(UID_C, ct, d->n, d->cout, d->ho, d->wo, &tc));
    PTL_CHECK(conv_desc(d, &conv));
    made = operation(dir, ta, tb, tc, conv, &op);
    if (made < 0)
        goto fail;
    if (made > 0)
        goto none;
    PTL_CUDNN_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &graph));
    PTL_CHECK(set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &cudnn));
    PTL_CHECK(set_desc(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, op));
    /* a problem the graph API does not take is no error: the caller goes the legacy way */
    st = cudnnBackendFinalize(graph);
    if (not_supported(st))
        goto none;
    PTL_CUDNN_TRY(st);
    PTL_CUDNN_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur));
    PTL_CHECK(set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph));
    PTL_CHECK(set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode));
    st = cudnnBackendFinalize(heur);
    if (not_supported(st))
        goto none;
    PTL_CUDNN_TRY(st);
    for (int i = 0; i < MAX_CFGS; i++)
        PTL_CUDNN_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[i]));
    PTL_CUDNN_TRY(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                           MAX_CFGS, &ncfg, cfgs));
    for (int64_t i = 0; i < ncfg && nplans < want; i++) {
        int index, top;
        const int ok = engine_allowed(cfgs[i], strict, o, &index, &top);
        if (ok < 0)
            goto fail;
        if (!ok)
            continue;
        PTL_CHECK(make_plan(cudnn, cfgs[i], &plans[nplans], &ws[nplans]));
        if (!plans[nplans] || (o->workspace_limit && ws[nplans] > o->workspace_limit)) {
            drop(&plans[nplans]);
            continue;
        }
        engines[nplans] = index;
        tops[nplans] = top;
        nplans++;
    }
    if (nplans > 1) {
        const graph_trial t = {cudnn, plans};
        size_t wsmax = 0;
        for (int i = 0; i < nplans; i++)
            if (ws[i] > wsmax)
                wsmax = ws[i];
        PTL_CHECK(ptl_conv_find_buffers_alloc(ctx, d, dt, wsmax, &fb));
        pick = ptl_conv_find_fastest(ctx, nplans, graph_run, (void *)&t, &fb);
        if (pick < 0)
            nplans = 0;
    }
    if (nplans) {
        e = (ptl_cudnn_conv_exec *)calloc(1, sizeof *e);
        if (!e) {
            ptl_set_error(PTL_ERR_MEMORY, "out of host memory");
            goto fail;
        }
        e->plan = plans[pick];
        plans[pick] = NULL;
        e->workspace = ws[pick];
        e->engine = engines[pick];
        e->tensor_op = tops[pick];
        *out = e;
    }
none:
    rc = 0;
fail:
    ptl_conv_find_buffers_free(ctx, &fb);
    for (int i = 0; i < PTL_CUDNN_GRAPH_FIND; i++)
        drop(&plans[i]);
    for (int i = 0; i < MAX_CFGS; i++)
        drop(&cfgs[i]);
    drop(&heur);
    drop(&graph);
    drop(&op);
    drop(&conv);
    drop(&tc);
    drop(&tb);
    drop(&ta);
    return rc;
}

void ptl_cudnn_conv_exec_destroy(ptl_cudnn_conv_exec *e)
{
    if (!e)
        return;
    drop(&e->plan);
    free(e);
}

size_t ptl_cudnn_conv_exec_workspace(const ptl_cudnn_conv_exec *e) { return e->workspace; }
int ptl_cudnn_conv_exec_engine(const ptl_cudnn_conv_exec *e) { return e->engine; }
int ptl_cudnn_conv_exec_tensor_op(const ptl_cudnn_conv_exec *e) { return e->tensor_op; }

int ptl_cudnn_conv_exec_run(ptl_cuda_ctx *ctx, const ptl_cudnn_conv_exec *e, const void *a, const void *b,
                            const void *c, void *workspace)
{
    if ((((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) & 15) != 0)
        return ptl_set_error(PTL_ERR_VALUE, "conv2d (cuDNN graph plan): tensors must be 16-byte aligned");
    return execute(ctx->cudnn, e->plan, a, b, c, workspace);
}
