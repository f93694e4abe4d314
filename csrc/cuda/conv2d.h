/* CUDA 2-D convolution through cuDNN, on the layouts of ../nn/conv2d.h: NHWC activations (n, h, w, cin),
 * OHWI weights (cout, k, k, cin/groups) = cuDNN's KRSC filters, padding k/2, any stride and groups.
 *
 * A plan is made once per (shape, dtype): it holds, per direction, a finalized cuDNN graph-API execution
 * plan (conv2d_cudnn_graph.h; or the legacy API's descriptors and algorithm), chosen at plan time
 * (heuristics, or a timed search with `find`), never during a step.
 * 1x1 stride-1 ungrouped convolutions (the many pointwise convs of the network) skip cuDNN and run as
 * cuBLAS GEMMs over the pixels, several times faster than cuDNN's heuristic picks for them. 3x3
 * depthwise convolutions (groups == cin == cout) run direct kernels: planning them through cuDNN 9's
 * legacy heuristics costs ~0.8 s each. The forward of 3x3 ungrouped convolutions with at most 4 input channels
 * (the stem) runs a direct kernel too, and in bfloat16 and float16 so does its weight gradient (conv2d_narrow.h):
 * cuDNN has no tensor-core engine for them.
 * The executing calls allocate nothing and never synchronise; they need a caller-owned device
 * workspace of at least ptl_conv2d_plan_workspace(plan) bytes.
 *
 * Precision: activations and weights in float32, bfloat16 or float16 (x, w, y, dx, dw, bias and dbias
 * all share the plan's dtype), accumulation in float32 (CUDNN_DATA_FLOAT / CUBLAS_COMPUTE_32F). float32
 * is true float32 (cuDNN FMA-only kernels, cuBLAS pedantic compute) unless allow_tf32 is set.
 * Deterministic plans give bitwise-identical results run to run (cuBLAS GEMMs are deterministic).
 */
#ifndef PTL_CUDA_CONV2D_H
#define PTL_CUDA_CONV2D_H

#include "../nn/conv2d.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ptl_cuda_ctx;
struct cudnnContext; /* cudnnHandle_t */
typedef struct ptl_conv2d_plan ptl_conv2d_plan;

typedef struct {
    int deterministic;      /* only algorithms cuDNN marks deterministic (backward data/filter) */
    int allow_tf32;         /* float32 only: permit TF32 tensor-core kernels */
    int find;               /* time the heuristics' candidates (under both permitted math types) on
                             * scratch buffers and keep the fastest, instead of taking the first */
    size_t workspace_limit; /* skip algorithms needing more workspace than this; 0 = no limit */
    int legacy_api;         /* cuDNN's legacy entry points instead of graph-API execution plans
                             * (conv2d_cudnn_graph.h), which cost a few us of host time per call instead
                             * of 33-83 us; also taken when no graph-API engine meets the options */
    int forward_only;       /* plan, warm and size the forward alone (a no-grad layout's convolutions): its
                             * backward calls raise */
} ptl_conv2d_plan_opts;

/* The defaults: deterministic, no TF32, heuristics, no workspace limit, the graph API unless the
 * environment says PTL_CUDNN_API=legacy (for comparisons), every direction. */
ptl_conv2d_plan_opts ptl_conv2d_plan_opts_default(void);

/* Builds the plan for `d` and activations of dtype `dt` (float32, bfloat16 or float16) on ctx's device,
 * asking cuDNN through handle `cudnn` (ctx's, or a plan-making thread's own). opts may be NULL for the
 * defaults. With opts->find the search runs convolutions on ctx's stream, on temporary buffers from ctx's
 * allocator (and synchronises) here, at plan time; cudnn must then be ctx's handle. */
int ptl_conv2d_plan_create(struct ptl_cuda_ctx *ctx, struct cudnnContext *cudnn, const ptl_conv2d_desc *d,
                           ptl_dtype dt, const ptl_conv2d_plan_opts *opts, ptl_conv2d_plan **out);
/* Plans are reference-counted: create hands out one reference, retain adds one, destroy drops one and
 * frees the plan with the last (thread-safe). refs is the current count. */
void ptl_conv2d_plan_retain(ptl_conv2d_plan *p);
void ptl_conv2d_plan_destroy(ptl_conv2d_plan *p);
int ptl_conv2d_plan_refs(const ptl_conv2d_plan *p);

/* The plans for (d[i], dt, opts) from ctx's plan cache (conv2d_plan_cache.c): each made on the first request,
 * shared by every later one, so a shape seen before costs no cuDNN query. The caller owns one reference per
 * out[i] (drop it with ptl_conv2d_plan_destroy); the cache keeps unreferenced plans up to a bound.
 * Asked for n at once (a network shape's convolutions), those the cache lacks are made
 * concurrently while the caller waits, one thread, cuDNN handle and stream each, up to the CPUs the process
 * may use (ptl_cpu_threads, 16 at most); each thread warms the plans it makes (ptl_conv2d_plan_warm) on
 * scratch it shares with the others, allocated for the call and freed after it (cudaMalloc / cudaFree:
 * this may synchronise). One missing plan, one CPU or opts->find (its timings need the device to
 * themselves): made on the calling thread with ctx's handle, not warmed. All n or none: on failure nothing
 * is held and the error is the first failing descriptor's. */
int ptl_conv2d_plans_acquire(struct ptl_cuda_ctx *ctx, int n, const ptl_conv2d_desc *d, ptl_dtype dt,
                             const ptl_conv2d_plan_opts *opts, ptl_conv2d_plan **out);
/* Runs each of p's directions once (forward, then unless p is forward-only backward-input, backward-weight
 * and backward-bias) on ctx's stream over scratch buffers whose contents do not matter: a of x's size (x,
 * then dx), b of at least w's and cout elements (w, dw, dbias), c of y's (y, dy), a workspace of
 * ptl_conv2d_plan_workspace(p). The first launch of a cuDNN kernel loads it (10-40 ms each on an H200) and
 * cuBLAS chooses a GEMM's algorithm at its first call per problem (~5 ms); a plan-making thread warms its
 * plans so that a step does neither. */
int ptl_conv2d_plan_warm(struct ptl_cuda_ctx *ctx, const ptl_conv2d_plan *p, void *a, void *b, void *c,
                         void *workspace, size_t workspace_bytes);
/* How many plans ctx's cache holds, and how many it has made (for tests and benchmarks). */
void ptl_conv2d_plan_cache_stats(struct ptl_cuda_ctx *ctx, int64_t *held, int64_t *made);

const ptl_conv2d_desc *ptl_conv2d_plan_desc(const ptl_conv2d_plan *p);
/* Whether both of d's activations' element counts fit 32-bit indices (the direct kernels' divisions by them are
 * several times cheaper). */
static inline int ptl_conv2d_int32_ok(const ptl_conv2d_desc *d)
{
    return (int64_t)d->n * d->h * d->w * d->cin < INT32_MAX && (int64_t)d->n * d->ho * d->wo * d->cout < INT32_MAX;
}
ptl_dtype ptl_conv2d_plan_dtype(const ptl_conv2d_plan *p);
/* Workspace bytes every call below needs (the maximum over the directions and the bias gradient). */
size_t ptl_conv2d_plan_workspace(const ptl_conv2d_plan *p);
/* Workspace bytes the weight and bias gradients need (at most the above): a second stream running them
 * beside the rest needs no more. */
size_t ptl_conv2d_plan_param_grads_workspace(const ptl_conv2d_plan *p);
/* Workspace bytes the forward and the input gradient need: what stays on a stream whose weight and bias
 * gradients run on another. */
size_t ptl_conv2d_plan_data_workspace(const ptl_conv2d_plan *p);
/* The chosen cuDNN algorithm numbers (cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t, or the graph API's
 * engine indices; -1 for the GEMM and direct paths) and whether each may run on tensor cores, for logs and
 * tests. */
void ptl_conv2d_plan_algos(const ptl_conv2d_plan *p, int algo[3], int tensor_op[3]);
/* Which path runs the plan: "cublas" (1x1 GEMMs), "direct" (depthwise kernels), "cudnn-graph" or
 * "cudnn-legacy". */
const char *ptl_conv2d_plan_path(const ptl_conv2d_plan *p);

/* y = conv(x, w) (+ bias) (overwrite). bias may be NULL. */
int ptl_conv2d_forward_cuda(struct ptl_cuda_ctx *ctx, const ptl_conv2d_plan *p, const void *x, const void *w,
                            const void *bias, void *y, void *workspace, size_t workspace_bytes);
/* dx = dL/dx (overwrite). */
int ptl_conv2d_backward_input_cuda(struct ptl_cuda_ctx *ctx, const ptl_conv2d_plan *p, const void *dy,
                                   const void *w, void *dx, void *workspace, size_t workspace_bytes);
/* dx += dL/dx, rounded once where the plan adds in place (ptl_conv2d_plan_adds_input_grad); otherwise dL/dx
 * goes to scratch (dx's size; NULL raises) and is added. For an input with several consumers. */
int ptl_conv2d_backward_input_add_cuda(struct ptl_cuda_ctx *ctx, const ptl_conv2d_plan *p, const void *dy,
                                       const void *w, void *dx, void *scratch, void *workspace,
                                       size_t workspace_bytes);
int ptl_conv2d_plan_adds_input_grad(const ptl_conv2d_plan *p);
/* dw += dL/dw. */
int ptl_conv2d_backward_weight_cuda(struct ptl_cuda_ctx *ctx, const ptl_conv2d_plan *p, const void *x,
                                    const void *dy, void *dw, void *workspace, size_t workspace_bytes);
/* dbias += sum of dy over (n, ho, wo), summed in a fixed order (bitwise reproducible). */
int ptl_conv2d_backward_bias_cuda(struct ptl_cuda_ctx *ctx, const ptl_conv2d_plan *p, const void *dy,
                                  void *dbias, void *workspace, size_t workspace_bytes);

#ifdef __cplusplus
}
#endif

#endif
