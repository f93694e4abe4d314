/* Fast CPU convolution plans over oneDNN (see conv2d.h). Activations are oneDNN's nhwc, the caller's
 * weights its ohwi/oihw (gohwi/goihw with groups); each convolution primitive picks its own weight
 * layout ("any") and the plan reorders the caller's weights into it, inside the call: weights change
 * every optimizer step.
 *
 * The weight gradient is one image's at a time: a primitive made for one image and one thread runs per
 * image, the images spread over the team (schedule(dynamic): a thread that lost its CPU to another
 * process holds up nobody), each into its own buffer in the workspace; the buffers are added in image
 * order and then to the caller's gradient by a reorder with a sum post-op. oneDNN's own multi-threaded
 * weight gradient sums in an order that depends on the thread count and synchronises its threads with
 * spinning barriers (measured: 3x slower than the other directions under a competing load). */
#include "conv2d.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vector.h"

#ifdef PTL_WITH_DNNL
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#include <pthread.h>

#define ALIGN 64

#define DNNL_TRY(call)                                                                                       \
    do {                                                                                                     \
        dnnl_status_t st_ = (call);                                                                          \
        if (st_ != dnnl_success) {                                                                           \
            ptl_set_error(PTL_ERR_RUNTIME, "conv2d (oneDNN): %s failed: %s", #call, dnnl_status2str(st_));   \
            goto fail;                                                                                       \
        }                                                                                                    \
    } while (0)

/* The forward or the input gradient: the convolution, the weight reorder (NULL when the caller's layout
 * is the primitive's) and the memory objects of what lives in the workspace. */
typedef struct {
    dnnl_primitive_t conv, reorder;
    dnnl_memory_t weights, scratch; /* the primitive's (diff) weights and its scratchpad */
    size_t weight_bytes, scratch_bytes;
    const char *impl;
} direction;

/* The weight gradient: the one-image primitive, the reorder that adds the summed partials to the
 * caller's gradient, and per image a stream and the memory objects of its input, output gradient,
 * partial weight gradient and scratchpad (images run concurrently, so nothing of these is shared). */
typedef struct {
    dnnl_primitive_t conv, reorder;
    int n;
    dnnl_stream_t *streams;
    dnnl_memory_t *src, *dst, *weights, *scratch;
    size_t weight_bytes, scratch_bytes;
    const char *impl;
} image_grad;

struct ptl_cpu_conv2d_plan {
    ptl_conv2d_desc d;
    ptl_cpu_conv2d_opts o;
    dnnl_stream_t stream;
    dnnl_memory_t src, dst, user_weights, bias; /* pointers set per call */
    direction fwd, bwd_data;
    image_grad grad;
    size_t workspace;
};

static dnnl_engine_t engine;
static dnnl_status_t engine_status = dnnl_runtime_error;
static pthread_once_t engine_once = PTHREAD_ONCE_INIT;

static void engine_init(void) { engine_status = dnnl_engine_create(&engine, dnnl_cpu, 0); }

int ptl_cpu_conv2d_available(void) { return 1; }

static size_t round_up(size_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

/* The primitive's weight buffer, then its scratchpad, from a 64-byte aligned base. */
static char *ws_base(void *workspace) { return (char *)(((uintptr_t)workspace + ALIGN - 1) / ALIGN * ALIGN); }

static void direction_free(direction *dr)
{
    if (dr->conv)
        dnnl_primitive_destroy(dr->conv);
    if (dr->reorder)
        dnnl_primitive_destroy(dr->reorder);
    if (dr->weights)
        dnnl_memory_destroy(dr->weights);
    if (dr->scratch)
        dnnl_memory_destroy(dr->scratch);
}

static void image_grad_free(image_grad *g)
{
    if (g->conv)
        dnnl_primitive_destroy(g->conv);
    if (g->reorder)
        dnnl_primitive_destroy(g->reorder);
    for (int i = 0; i < g->n; i++) {
        dnnl_memory_t mems[] = {g->src[i], g->dst[i], g->weights[i], g->scratch[i]};
        for (size_t j = 0; j < sizeof mems / sizeof mems[0]; j++)
            if (mems[j])
                dnnl_memory_destroy(mems[j]);
        if (g->streams[i])
            dnnl_stream_destroy(g->streams[i]);
    }
    free(g->streams);
    free(g->src);
    free(g->dst);
    free(g->weights);
    free(g->scratch);
}

void ptl_cpu_conv2d_plan_destroy(ptl_cpu_conv2d_plan *p)
{
    if (!p)
        return;
    direction_free(&p->fwd);
    direction_free(&p->bwd_data);
    image_grad_free(&p->grad);
    dnnl_memory_t mems[] = {p->src, p->dst, p->user_weights, p->bias};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++)
        if (mems[i])
            dnnl_memory_destroy(mems[i]);
    if (p->stream)
        dnnl_stream_destroy(p->stream);
    free(p);
}

static int weights_md(const ptl_conv2d_desc *d, dnnl_format_tag_t ungrouped, dnnl_format_tag_t grouped,
                      dnnl_memory_desc_t *md)
{
    if (d->groups == 1) {
        const dnnl_dims_t dims = {d->cout, d->cin, d->k, d->k};
        DNNL_TRY(dnnl_memory_desc_init_by_tag(md, 4, dims, dnnl_f32, ungrouped));
    } else {
        const dnnl_dims_t dims = {d->groups, d->cout / d->groups, d->cin / d->groups, d->k, d->k};
        DNNL_TRY(dnnl_memory_desc_init_by_tag(md, 5, dims, dnnl_f32, grouped));
    }
    return 0;
fail:
    return -1;
}

/* Completes the forward or input-gradient direction from its primitive descriptor: the primitive, the
 * memory objects of its weights and scratchpad, and the reorder of the caller's weights into the
 * primitive's layout (none when they agree). */
static int direction_finish(dnnl_primitive_desc_t pd, const dnnl_memory_desc_t *user, direction *dr)
{
    dnnl_primitive_desc_t rpd = NULL;
    const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    const char *impl = "";
    DNNL_TRY(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl));
    dr->impl = impl; /* owned by the primitive descriptor, which the primitive keeps alive */
    DNNL_TRY(dnnl_primitive_create(&dr->conv, pd));
    DNNL_TRY(dnnl_memory_create(&dr->scratch, smd, engine, DNNL_MEMORY_NONE));
    dr->scratch_bytes = dnnl_memory_desc_get_size(smd);
    if (!dnnl_memory_desc_equal(wmd, user)) {
        DNNL_TRY(dnnl_memory_create(&dr->weights, wmd, engine, DNNL_MEMORY_NONE));
        dr->weight_bytes = dnnl_memory_desc_get_size(wmd);
        DNNL_TRY(dnnl_reorder_primitive_desc_create(&rpd, user, engine, wmd, engine, NULL));
        DNNL_TRY(dnnl_primitive_create(&dr->reorder, rpd));
        dnnl_primitive_desc_destroy(rpd);
    }
    return 0;
fail:
    if (rpd)
        dnnl_primitive_desc_destroy(rpd);
    return -1;
}

/* The one-image weight-gradient primitive, made while the calling thread's team size is 1 (oneDNN sizes
 * its thread decomposition when a primitive is made), and the per-image objects. */
static int image_grad_init(ptl_cpu_conv2d_plan *p, const_dnnl_primitive_attr_t attr, const dnnl_memory_desc_t *user_md,
                           const dnnl_memory_desc_t *any_md, const dnnl_dims_t strides, const dnnl_dims_t pad_l,
                           const dnnl_dims_t pad_r)
{
    const ptl_conv2d_desc *d = &p->d;
    image_grad *g = &p->grad;
    dnnl_primitive_desc_t fpd = NULL, wpd = NULL, rpd = NULL;
    dnnl_primitive_attr_t rattr = NULL;
    dnnl_post_ops_t sum = NULL;
    const int team = omp_get_max_threads();
    omp_set_num_threads(1);
    const dnnl_dims_t sdims = {1, d->cin, d->h, d->w}, ddims = {1, d->cout, d->ho, d->wo};
    dnnl_memory_desc_t src_md, dst_md;
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&src_md, 4, sdims, dnnl_f32, dnnl_nhwc));
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&dst_md, 4, ddims, dnnl_f32, dnnl_nhwc));
    dnnl_convolution_desc_t cd;
    DNNL_TRY(dnnl_convolution_forward_desc_init(&cd, dnnl_forward_training, dnnl_convolution_direct, &src_md, any_md,
                                                NULL, &dst_md, strides, pad_l, pad_r));
    DNNL_TRY(dnnl_primitive_desc_create(&fpd, &cd, attr, engine, NULL));
    DNNL_TRY(dnnl_convolution_backward_weights_desc_init(&cd, dnnl_convolution_direct, &src_md, any_md, NULL, &dst_md,
                                                         strides, pad_l, pad_r));
    DNNL_TRY(dnnl_primitive_desc_create(&wpd, &cd, attr, engine, fpd));
    const char *impl = "";
    DNNL_TRY(dnnl_primitive_desc_query(wpd, dnnl_query_impl_info_str, 0, &impl));
    g->impl = impl;
    DNNL_TRY(dnnl_primitive_create(&g->conv, wpd));
    const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(wpd, dnnl_query_diff_weights_md, 0);
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(wpd, dnnl_query_scratchpad_md, 0);
    g->weight_bytes = dnnl_memory_desc_get_size(wmd);
    g->scratch_bytes = dnnl_memory_desc_get_size(smd);
    DNNL_TRY(dnnl_primitive_attr_create(&rattr));
    DNNL_TRY(dnnl_post_ops_create(&sum));
    DNNL_TRY(dnnl_post_ops_append_sum(sum, 1.0f));
    DNNL_TRY(dnnl_primitive_attr_set_post_ops(rattr, sum));
    DNNL_TRY(dnnl_reorder_primitive_desc_create(&rpd, wmd, engine, user_md, engine, rattr));
    DNNL_TRY(dnnl_primitive_create(&g->reorder, rpd));
    if (!(g->streams = calloc((size_t)d->n, sizeof *g->streams)) || !(g->src = calloc((size_t)d->n, sizeof *g->src)) ||
        !(g->dst = calloc((size_t)d->n, sizeof *g->dst)) || !(g->weights = calloc((size_t)d->n, sizeof *g->weights)) ||
        !(g->scratch = calloc((size_t)d->n, sizeof *g->scratch))) {
        ptl_set_error(PTL_ERR_MEMORY, "cpu_conv2d_plan_create: out of memory");
        goto fail;
    }
    g->n = d->n;
    for (int i = 0; i < d->n; i++) {
        DNNL_TRY(dnnl_stream_create(&g->streams[i], engine, dnnl_stream_default_flags));
        DNNL_TRY(dnnl_memory_create(&g->src[i], &src_md, engine, DNNL_MEMORY_NONE));
        DNNL_TRY(dnnl_memory_create(&g->dst[i], &dst_md, engine, DNNL_MEMORY_NONE));
        DNNL_TRY(dnnl_memory_create(&g->weights[i], wmd, engine, DNNL_MEMORY_NONE));
        DNNL_TRY(dnnl_memory_create(&g->scratch[i], smd, engine, DNNL_MEMORY_NONE));
    }
    omp_set_num_threads(team);
    dnnl_primitive_desc_destroy(fpd);
    dnnl_primitive_desc_destroy(wpd);
    dnnl_primitive_desc_destroy(rpd);
    dnnl_primitive_attr_destroy(rattr);
    dnnl_post_ops_destroy(sum);
    return 0;
fail:
    omp_set_num_threads(team);
    if (fpd)
        dnnl_primitive_desc_destroy(fpd);
    if (wpd)
        dnnl_primitive_desc_destroy(wpd);
    if (rpd)
        dnnl_primitive_desc_destroy(rpd);
    if (rattr)
        dnnl_primitive_attr_destroy(rattr);
    if (sum)
        dnnl_post_ops_destroy(sum);
    return -1;
}

int ptl_cpu_conv2d_plan_create(const ptl_conv2d_desc *d, const ptl_cpu_conv2d_opts *opts,
                               ptl_cpu_conv2d_plan **out)
{
    ptl_cpu_conv2d_plan *p = NULL;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t fpd = NULL, bpd = NULL;
    if (!d || !opts || !out)
        return ptl_set_error(PTL_ERR_VALUE, "cpu_conv2d_plan_create: d, opts and out must not be NULL");
    *out = NULL;
    if (opts->weights != PTL_CPU_WEIGHTS_OHWI && opts->weights != PTL_CPU_WEIGHTS_OIHW)
        return ptl_set_error(PTL_ERR_VALUE, "cpu_conv2d_plan_create: unknown weight layout %d", (int)opts->weights);
    if (!opts->directions || opts->directions & ~PTL_CPU_CONV_ALL)
        return ptl_set_error(PTL_ERR_VALUE, "cpu_conv2d_plan_create: directions must be a nonzero mask of "
                             "PTL_CPU_CONV_* bits, got %d", opts->directions);
    ptl_conv2d_desc chk;
    if (ptl_conv2d_init(&chk, d->n, d->h, d->w, d->cin, d->cout, d->k, d->stride, d->groups))
        return -1;
    if (memcmp(&chk, d, sizeof chk))
        return ptl_set_error(PTL_ERR_VALUE, "cpu_conv2d_plan_create: the descriptor was not made by ptl_conv2d_init");
    pthread_once(&engine_once, engine_init);
    if (engine_status != dnnl_success)
        return ptl_set_error(PTL_ERR_RUNTIME, "conv2d (oneDNN): dnnl_engine_create failed: %s",
                             dnnl_status2str(engine_status));
    if (!(p = calloc(1, sizeof *p)))
        return ptl_set_error(PTL_ERR_MEMORY, "cpu_conv2d_plan_create: out of memory");
    p->d = *d;
    p->o = *opts;

    const dnnl_dims_t sdims = {d->n, d->cin, d->h, d->w}, ddims = {d->n, d->cout, d->ho, d->wo};
    const dnnl_dims_t strides = {d->stride, d->stride}, pad_l = {d->pad, d->pad};
    /* the right padding that makes the output size exact (at most k/2; oneDNN checks the sizes agree) */
    const dnnl_dims_t pad_r = {(d->ho - 1) * d->stride + d->k - d->h - d->pad,
                               (d->wo - 1) * d->stride + d->k - d->w - d->pad};
    dnnl_memory_desc_t src_md, dst_md, user_md, any_md, bias_md;
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&src_md, 4, sdims, dnnl_f32, dnnl_nhwc));
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&dst_md, 4, ddims, dnnl_f32, dnnl_nhwc));
    const dnnl_dims_t bdims = {d->cout};
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&bias_md, 1, bdims, dnnl_f32, dnnl_a));
    if (opts->weights == PTL_CPU_WEIGHTS_OHWI)
        PTL_CHECK(weights_md(d, dnnl_ohwi, dnnl_gohwi, &user_md));
    else
        PTL_CHECK(weights_md(d, dnnl_oihw, dnnl_goihw, &user_md));
    PTL_CHECK(weights_md(d, dnnl_format_tag_any, dnnl_format_tag_any, &any_md));
    DNNL_TRY(dnnl_stream_create(&p->stream, engine, dnnl_stream_default_flags));
    DNNL_TRY(dnnl_memory_create(&p->src, &src_md, engine, DNNL_MEMORY_NONE));
    DNNL_TRY(dnnl_memory_create(&p->dst, &dst_md, engine, DNNL_MEMORY_NONE));
    DNNL_TRY(dnnl_memory_create(&p->user_weights, &user_md, engine, DNNL_MEMORY_NONE));
    DNNL_TRY(dnnl_memory_create(&p->bias, &bias_md, engine, DNNL_MEMORY_NONE));
    /* the scratchpad comes from the caller's workspace, so oneDNN allocates nothing per call */
    DNNL_TRY(dnnl_primitive_attr_create(&attr));
    DNNL_TRY(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));

    /* The backward primitives take the forward one as a hint (oneDNN requires it), so it is always made. */
    dnnl_convolution_desc_t cd;
    const dnnl_prop_kind_t prop = opts->directions == PTL_CPU_CONV_FORWARD ? dnnl_forward_inference
                                                                            : dnnl_forward_training;
    DNNL_TRY(dnnl_convolution_forward_desc_init(&cd, prop, dnnl_convolution_direct, &src_md, &any_md,
                                                opts->bias ? &bias_md : NULL, &dst_md, strides, pad_l, pad_r));
    DNNL_TRY(dnnl_primitive_desc_create(&fpd, &cd, attr, engine, NULL));
    if (opts->directions & PTL_CPU_CONV_FORWARD)
        PTL_CHECK(direction_finish(fpd, &user_md, &p->fwd));
    if (opts->directions & PTL_CPU_CONV_BACKWARD_INPUT) {
        DNNL_TRY(dnnl_convolution_backward_data_desc_init(&cd, dnnl_convolution_direct, &src_md, &any_md, &dst_md,
                                                          strides, pad_l, pad_r));
        DNNL_TRY(dnnl_primitive_desc_create(&bpd, &cd, attr, engine, fpd));
        PTL_CHECK(direction_finish(bpd, &user_md, &p->bwd_data));
    }
    if (opts->directions & PTL_CPU_CONV_BACKWARD_WEIGHT)
        PTL_CHECK(image_grad_init(p, attr, &user_md, &any_md, strides, pad_l, pad_r));
    const direction *dirs[2] = {&p->fwd, &p->bwd_data};
    for (int i = 0; i < 2; i++) {
        const size_t need = round_up(dirs[i]->weight_bytes) + round_up(dirs[i]->scratch_bytes);
        if (need > p->workspace)
            p->workspace = need;
    }
    const size_t grad_need = (size_t)p->grad.n * (round_up(p->grad.weight_bytes) + round_up(p->grad.scratch_bytes));
    if (grad_need > p->workspace)
        p->workspace = grad_need;
    if (p->workspace)
        p->workspace += ALIGN; /* room to align the caller's pointer */
    dnnl_primitive_desc_destroy(fpd);
    if (bpd)
        dnnl_primitive_desc_destroy(bpd);
    dnnl_primitive_attr_destroy(attr);
    *out = p;
    return 0;
fail:
    if (fpd)
        dnnl_primitive_desc_destroy(fpd);
    if (bpd)
        dnnl_primitive_desc_destroy(bpd);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    ptl_cpu_conv2d_plan_destroy(p);
    return -1;
}

size_t ptl_cpu_conv2d_plan_workspace(const ptl_cpu_conv2d_plan *p) { return p->workspace; }

const char *ptl_cpu_conv2d_plan_impl(const ptl_cpu_conv2d_plan *p, int dir)
{
    const char *impl = dir == PTL_CPU_CONV_FORWARD          ? p->fwd.impl
                       : dir == PTL_CPU_CONV_BACKWARD_INPUT ? p->bwd_data.impl
                       : dir == PTL_CPU_CONV_BACKWARD_WEIGHT ? p->grad.impl
                                                             : NULL;
    return impl ? impl : "";
}

/* The checks every call makes, then the workspace pointers of direction dr set. */
static int begin(const char *fn, const ptl_cpu_conv2d_plan *p, int bit, const direction *dr, void *workspace,
                 size_t workspace_bytes)
{
    if (!p)
        return ptl_set_error(PTL_ERR_VALUE, "%s: plan must not be NULL", fn);
    if (!(p->o.directions & bit))
        return ptl_set_error(PTL_ERR_VALUE, "%s: the plan was made without this direction", fn);
    if (workspace_bytes < p->workspace || (p->workspace && !workspace))
        return ptl_set_error(PTL_ERR_VALUE, "%s: workspace of %zu bytes given, the plan needs %zu", fn,
                             workspace ? workspace_bytes : 0, p->workspace);
    char *base = p->workspace ? ws_base(workspace) : NULL;
    if (dr->weights)
        DNNL_TRY(dnnl_memory_set_data_handle(dr->weights, base));
    DNNL_TRY(dnnl_memory_set_data_handle(dr->scratch, base ? base + round_up(dr->weight_bytes) : NULL));
    return 0;
fail:
    return -1;
}

static int run(const char *fn, const ptl_cpu_conv2d_plan *p, dnnl_primitive_t prim, int nargs,
               const dnnl_exec_arg_t *args)
{
    const dnnl_status_t st = dnnl_primitive_execute(prim, p->stream, nargs, args);
    if (st != dnnl_success)
        return ptl_set_error(PTL_ERR_RUNTIME, "%s (oneDNN): dnnl_primitive_execute failed: %s", fn,
                             dnnl_status2str(st));
    return 0;
}

int ptl_cpu_conv2d_forward(const ptl_cpu_conv2d_plan *p, const float *x, const float *w, const float *bias,
                           float *y, void *workspace, size_t workspace_bytes)
{
    static const char fn[] = "cpu_conv2d_forward";
    if (p && (!x || !w || !y))
        return ptl_set_error(PTL_ERR_VALUE, "%s: x, w and y must not be NULL", fn);
    if (p && !bias != !p->o.bias)
        return ptl_set_error(PTL_ERR_VALUE, "%s: the plan was made %s a bias", fn, p->o.bias ? "with" : "without");
    if (begin(fn, p, PTL_CPU_CONV_FORWARD, p ? &p->fwd : NULL, workspace, workspace_bytes))
        return -1;
    DNNL_TRY(dnnl_memory_set_data_handle(p->src, (void *)x));
    DNNL_TRY(dnnl_memory_set_data_handle(p->user_weights, (void *)w));
    DNNL_TRY(dnnl_memory_set_data_handle(p->dst, y));
    if (bias)
        DNNL_TRY(dnnl_memory_set_data_handle(p->bias, (void *)bias));
    dnnl_memory_t wmem = p->user_weights;
    if (p->fwd.reorder) {
        const dnnl_exec_arg_t r[2] = {{DNNL_ARG_FROM, p->user_weights}, {DNNL_ARG_TO, p->fwd.weights}};
        PTL_CHECK(run(fn, p, p->fwd.reorder, 2, r));
        wmem = p->fwd.weights;
    }
    const dnnl_exec_arg_t a[5] = {{DNNL_ARG_SRC, p->src}, {DNNL_ARG_WEIGHTS, wmem}, {DNNL_ARG_DST, p->dst},
                                  {DNNL_ARG_SCRATCHPAD, p->fwd.scratch}, {DNNL_ARG_BIAS, p->bias}};
    return run(fn, p, p->fwd.conv, bias ? 5 : 4, a);
fail:
    return -1;
}

int ptl_cpu_conv2d_backward_input(const ptl_cpu_conv2d_plan *p, const float *dy, const float *w, float *dx,
                                  void *workspace, size_t workspace_bytes)
{
    static const char fn[] = "cpu_conv2d_backward_input";
    if (p && (!dy || !w || !dx))
        return ptl_set_error(PTL_ERR_VALUE, "%s: dy, w and dx must not be NULL", fn);
    if (begin(fn, p, PTL_CPU_CONV_BACKWARD_INPUT, p ? &p->bwd_data : NULL, workspace, workspace_bytes))
        return -1;
    DNNL_TRY(dnnl_memory_set_data_handle(p->dst, (void *)dy));
    DNNL_TRY(dnnl_memory_set_data_handle(p->user_weights, (void *)w));
    DNNL_TRY(dnnl_memory_set_data_handle(p->src, dx));
    dnnl_memory_t wmem = p->user_weights;
    if (p->bwd_data.reorder) {
        const dnnl_exec_arg_t r[2] = {{DNNL_ARG_FROM, p->user_weights}, {DNNL_ARG_TO, p->bwd_data.weights}};
        PTL_CHECK(run(fn, p, p->bwd_data.reorder, 2, r));
        wmem = p->bwd_data.weights;
    }
    const dnnl_exec_arg_t a[4] = {{DNNL_ARG_DIFF_DST, p->dst}, {DNNL_ARG_WEIGHTS, wmem},
                                  {DNNL_ARG_DIFF_SRC, p->src}, {DNNL_ARG_SCRATCHPAD, p->bwd_data.scratch}};
    return run(fn, p, p->bwd_data.conv, 4, a);
fail:
    return -1;
}

/* Adds the partial gradients of images 1.. to image 0's, in image order, over the whole buffer (the
 * blocked layout's padding holds zeros in all of them). */
PTL_CPU_CLONES
static void sum_partials(float *dst, const char *base, size_t stride, int n, int64_t i0, int64_t i1)
{
    for (int k = 1; k < n; k++) {
        const float *src = (const float *)(base + (size_t)k * stride);
#pragma omp simd
        for (int64_t i = i0; i < i1; i++)
            dst[i] += src[i];
    }
}

int ptl_cpu_conv2d_backward_weight(const ptl_cpu_conv2d_plan *p, const float *x, const float *dy, float *dw,
                                   void *workspace, size_t workspace_bytes)
{
    static const char fn[] = "cpu_conv2d_backward_weight";
    if (!p)
        return ptl_set_error(PTL_ERR_VALUE, "%s: plan must not be NULL", fn);
    if (!x || !dy || !dw)
        return ptl_set_error(PTL_ERR_VALUE, "%s: x, dy and dw must not be NULL", fn);
    if (!(p->o.directions & PTL_CPU_CONV_BACKWARD_WEIGHT))
        return ptl_set_error(PTL_ERR_VALUE, "%s: the plan was made without this direction", fn);
    if (!workspace || workspace_bytes < p->workspace)
        return ptl_set_error(PTL_ERR_VALUE, "%s: workspace of %zu bytes given, the plan needs %zu", fn,
                             workspace ? workspace_bytes : 0, p->workspace);
    const image_grad *g = &p->grad;
    const ptl_conv2d_desc *d = &p->d;
    char *base = ws_base(workspace);
    const size_t wstride = round_up(g->weight_bytes), sstride = round_up(g->scratch_bytes);
    const int64_t xs = (int64_t)d->h * d->w * d->cin, ys = (int64_t)d->ho * d->wo * d->cout;
    dnnl_status_t bad = dnnl_success;
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < g->n; i++) {
        dnnl_status_t st = dnnl_memory_set_data_handle(g->src[i], (void *)(x + i * xs));
        if (st == dnnl_success)
            st = dnnl_memory_set_data_handle(g->dst[i], (void *)(dy + i * ys));
        if (st == dnnl_success)
            st = dnnl_memory_set_data_handle(g->weights[i], base + (size_t)i * wstride);
        if (st == dnnl_success)
            st = dnnl_memory_set_data_handle(g->scratch[i], base + (size_t)g->n * wstride + (size_t)i * sstride);
        const dnnl_exec_arg_t a[4] = {{DNNL_ARG_SRC, g->src[i]}, {DNNL_ARG_DIFF_DST, g->dst[i]},
                                      {DNNL_ARG_DIFF_WEIGHTS, g->weights[i]}, {DNNL_ARG_SCRATCHPAD, g->scratch[i]}};
        if (st == dnnl_success)
            st = dnnl_primitive_execute(g->conv, g->streams[i], 4, a);
        if (st != dnnl_success) {
#pragma omp critical(ptl_cpu_conv2d_status)
            bad = st;
        }
    }
    if (bad != dnnl_success)
        return ptl_set_error(PTL_ERR_RUNTIME, "%s (oneDNN): dnnl_primitive_execute failed: %s", fn, dnnl_status2str(bad));
    const int64_t total = (int64_t)(g->weight_bytes / sizeof(float)), chunk = 16384;
    const int64_t nchunks = (total + chunk - 1) / chunk;
#pragma omp parallel for schedule(dynamic, 1) if (nchunks > 1 && total * g->n > PTL_CPU_PAR_MIN)
    for (int64_t c = 0; c < nchunks; c++)
        sum_partials((float *)base, base, wstride, g->n, c * chunk, c + 1 < nchunks ? (c + 1) * chunk : total);
    DNNL_TRY(dnnl_memory_set_data_handle(p->user_weights, dw));
    const dnnl_exec_arg_t r[2] = {{DNNL_ARG_FROM, g->weights[0]}, {DNNL_ARG_TO, p->user_weights}};
    return run(fn, p, g->reorder, 2, r);
fail:
    return -1;
}

#else /* built without oneDNN */

struct ptl_cpu_conv2d_plan {
    ptl_conv2d_desc d;
};

int ptl_cpu_conv2d_available(void) { return 0; }

static int unavailable(const char *fn)
{
    return ptl_set_error(PTL_ERR_RUNTIME, "%s: this ptl was built without oneDNN (install libdnnl-dev and rebuild)",
                         fn);
}

int ptl_cpu_conv2d_plan_create(const ptl_conv2d_desc *d, const ptl_cpu_conv2d_opts *opts,
                               ptl_cpu_conv2d_plan **out)
{
    (void)d;
    (void)opts;
    if (out)
        *out = NULL;
    return unavailable("cpu_conv2d_plan_create");
}

void ptl_cpu_conv2d_plan_destroy(ptl_cpu_conv2d_plan *p) { free(p); }

size_t ptl_cpu_conv2d_plan_workspace(const ptl_cpu_conv2d_plan *p)
{
    (void)p;
    return 0;
}

const char *ptl_cpu_conv2d_plan_impl(const ptl_cpu_conv2d_plan *p, int dir)
{
    (void)p;
    (void)dir;
    return "";
}

int ptl_cpu_conv2d_forward(const ptl_cpu_conv2d_plan *p, const float *x, const float *w, const float *bias,
                           float *y, void *workspace, size_t workspace_bytes)
{
    (void)p, (void)x, (void)w, (void)bias, (void)y, (void)workspace, (void)workspace_bytes;
    return unavailable("cpu_conv2d_forward");
}

int ptl_cpu_conv2d_backward_input(const ptl_cpu_conv2d_plan *p, const float *dy, const float *w, float *dx,
                                  void *workspace, size_t workspace_bytes)
{
    (void)p, (void)dy, (void)w, (void)dx, (void)workspace, (void)workspace_bytes;
    return unavailable("cpu_conv2d_backward_input");
}

int ptl_cpu_conv2d_backward_weight(const ptl_cpu_conv2d_plan *p, const float *x, const float *dy, float *dw,
                                   void *workspace, size_t workspace_bytes)
{
    (void)p, (void)x, (void)dy, (void)dw, (void)workspace, (void)workspace_bytes;
    return unavailable("cpu_conv2d_backward_weight");
}

#endif

/* Blocks of 16 channels (one AVX-512 vector of float, two of double) per task; each channel summed in
 * double over the pixels in order and added once, the reference's order. */
#define BIAS_BLOCK 16

int ptl_cpu_conv2d_backward_bias(const ptl_cpu_conv2d_plan *p, const float *dy, float *dbias)
{
    if (!p || !dy || !dbias)
        return ptl_set_error(PTL_ERR_VALUE, "cpu_conv2d_backward_bias: plan, dy and dbias must not be NULL");
    const int cout = p->d.cout;
    const int64_t pixels = (int64_t)p->d.n * p->d.ho * p->d.wo;
    const int nblocks = (cout + BIAS_BLOCK - 1) / BIAS_BLOCK;
#pragma omp parallel for schedule(static) if (pixels * cout > 262144)
    for (int blk = 0; blk < nblocks; blk++) {
        const int c0 = blk * BIAS_BLOCK, nc = c0 + BIAS_BLOCK < cout ? BIAS_BLOCK : cout - c0;
        double acc[BIAS_BLOCK] = {0};
        for (int64_t r = 0; r < pixels; r++) {
            const float *row = dy + r * cout + c0;
            for (int j = 0; j < nc; j++)
                acc[j] += row[j];
        }
        for (int j = 0; j < nc; j++)
            dbias[c0 + j] = (float)(dbias[c0 + j] + acc[j]);
    }
    return 0;
}
