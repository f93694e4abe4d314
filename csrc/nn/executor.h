/* The network executor: one forward/backward over the network description (network.h), run on a
 * backend table filled by the CPU reference kernels (backend_cpu.c), the fast CPU kernels
 * (../cpu/backend_cpu_fast.c, float32) or the CUDA kernels (../cuda/backend_cuda.c). Nothing here knows
 * which backend it drives.
 *
 * Design, in the order the pieces are made:
 *
 *   description   (network.h, built once by the builder) the op list, the values (NHWC tensors at a
 *                 fraction of the input resolution), the flat-storage layout of parameters and BN
 *                 buffers. Backend independent; the float32/float64 host storage lives there. Every op has
 *                 one signature (its inputs' channel ranges, outputs, which inputs get a gradient and which
 *                 the backward reads, its parameters and buffers): all below reads that, not the kinds.
 *   plans         (net_plan.h, derived from the description once, for every backend)
 *                 - the ops the executor runs: the description's, with each Concat built in place where the
 *                   backend's kernels take channel slices (its parts' producers write into it);
 *                 - the gradient plan: the backward visits the ops in reverse; the first op to write a
 *                   value's gradient overwrites it, later writers add (so nothing is zeroed in bulk); a
 *                   value whose first write covers only some channels, or that is read before anything
 *                   writes it, has its slot zeroed right before that op; each gradient lives from its
 *                   first write to the backward step of its producer;
 *                 - the weight-cast table: where each conv weight (and, for a backend that casts
 *                   biases, each bias) sits in the compute-dtype OHWI copy;
 *                 - per batch shape, the memory layout: one arena whose slots hold the activations,
 *                   the gradients and the backward's scratch, placed largest first on one clock
 *                   over the forward and the backward (each lives from its first write to its last
 *                   read, so the gradients take the memory of the activations the backward has read;
 *                   a forward-only layout keeps nothing for a backward); attention probabilities, the
 *                   size of the conv workspace.
 *   executor      (this file) one instance per (description, backend, device, compute dtype): master
 *                 storage (params, grads, BN buffers, saved batch statistics) in the master dtype, the
 *                 compute-dtype weight copy and weight-gradient buffer, and per-shape slots (the
 *                 layout's buffers, the conv plans, a recording): two for the most recently used
 *                 batch shapes in training mode (a fit's full batches and its partial last batch),
 *                 least recently used evicted first, and one for eval mode (validation, prediction).
 *   backend       (ptl_net_backend below) memory, conv plans and the layer kernels, each called with the
 *                 one execution context of the device (`struct ptl_cuda_ctx`: stream, cuBLAS/cuDNN
 *                 handles, allocator, layer scratch; NULL on the CPU, which needs none of them). The
 *                 executor runs the convolutions (plans, weight copies) and the head's outputs itself;
 *                 every other kind through its `layer` row, with the op's memory for the shape in one
 *                 ptl_net_call.
 *   recorder      (../cuda/recorder.h) captures what the executor runs on the CUDA backend into graphs
 *                 kept in the shape's slot.
 *
 * Precision. master dtype: parameters, gradients, BN statistics and head outputs (and their
 * gradients): float32 on CUDA, the description's dtype (float32 or float64) on the CPU. compute
 * dtype: activations and their gradients: float32, bfloat16 or float16 on CUDA, the master dtype on
 * the CPU. Every forward starts with ONE cast of all conv weights (OIHW master) into the compute-dtype
 * OHWI copy (on the CPU a plain layout copy); the backward adds conv weight gradients, computed in
 * the compute dtype into the zeroed weight-gradient buffer, back into the master gradient in ONE pass
 * at its end. A backend with cast_biases = 1 (CUDA) treats conv biases the same way; with 0 (CPU)
 * biases are read from the master parameters and their gradients added there directly. BatchNorm
 * gamma/beta gradients, like every parameter gradient of a `layer` row, are added to the master gradient
 * directly.
 *
 * Order of additions. Every gradient element receives the same additions in the same order on every
 * backend, so the CPU backend computes exactly what the CUDA executor's host logic prescribes, and a
 * CPU run is bitwise reproducible whatever the slot sharing or the shape history.
 *
 * Concurrency: on a backend with side queues (CUDA streams) the backward's conv weight gradients and the
 * branches run beside the rest (PTL_NET_SIDE_LAG, PTL_NET_SIDE_DETACHED below); the layout keeps
 * what they touch alive while they may run (net_plan.h's ptl_net_concurrency), so the bits are those of
 * one queue.
 *
 * Hot path: forward and backward call backend kernels on preallocated memory only; every allocation
 * and every conv plan is made by ptl_net_exec_prepare (a no-op for a shape held in a slot), so the
 * work of a step keeps its addresses and can be captured. */
#ifndef PTL_NN_EXECUTOR_H
#define PTL_NN_EXECUTOR_H

#include <stddef.h>
#include <stdint.h>

#include "../ptl.h"
#include "../runtime.h"
#include "activation.h"
#include "conv2d.h"
#include "net_plan.h"
#include "network.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ptl_cuda_ctx;
typedef struct ptl_net_recording ptl_net_recording; /* ../cuda/recorder.h */
struct ptl_net_tail;                                 /* work the recorder captures after a backward (below) */

/* Memory of one backend allocation: ptr to use, block to give back. */
typedef struct {
    void *ptr, *block;
} ptl_net_buf;

/* Convolution algorithm choice (CUDA plans; the CPU kernels have one algorithm). forward_only: plans for a
 * no-grad layout, which runs no backward (the CUDA backend then plans, warms and sizes the forward alone,
 * and its backward calls raise; the CPU backends ignore it). */
typedef struct {
    int deterministic, allow_tf32, find, forward_only;
    size_t workspace_limit; /* no algorithm needing more workspace than this (bytes; 0: no limit) */
} ptl_net_conv_opts;

typedef struct ptl_cuda_ctx ptl_exec_ctx; /* the execution context every backend function takes */
struct ptl_net_exec;

/* One value of a layer call: its memory and NHWC shape (n: the call's B). */
typedef struct {
    void *data;     /* the activation, the whole value (in a backward: NULL but for the inputs the op keeps) */
    void *grad;     /* its gradient, in a backward (NULL for an input whose gradient is not wanted) */
    int h, w, c;
    int c0, nc;     /* an input: the channels [c0, c0 + nc) the op reads */
    int accumulate; /* an input's gradient in the backward: 1 adds, 0 overwrites */
} ptl_net_arg;

/* A layer call of the backend table's `layer` rows: the op (its kind's attributes) and, for the current
 * shape, the memory of everything it reads or writes. Activations, their gradients and the saved buffer
 * are in the compute dtype dt; parameters, their gradients and buffers in the master dtype. */
typedef struct {
    const ptl_net_op *op;
    const struct ptl_net_backend *be; /* the backend running it (the kernels of rows written over its others) */
    ptl_dtype dt;
    int B;
    int training; /* batch statistics (the running ones updated); 0 also where the op's buffers are frozen */
    int nin, nout;
    ptl_net_arg in[PTL_NET_MAX_PARTS], out[2];
    void *saved; /* ptl_net_op_saved_numel elements, written by the forward for the backward */
    void *kept;  /* the backend's own bytes for the backward (its row's kept_bytes; NULL: none, or a
                  * forward-only layout's call) */
    const void *params[PTL_NET_MAX_OP_PARAMS];
    void *grads[PTL_NET_MAX_OP_PARAMS]; /* the backward adds (NULL: frozen) */
    void *buffers[PTL_NET_MAX_OP_BUFFERS];
} ptl_net_call;

/* A layer kind's row: the forward writes the outputs (and saved); the backward, from the outputs' gradients,
 * writes or adds (accumulate) each input gradient that is not NULL and adds the parameter gradients. The
 * executor runs every kind that has a row, so a new layer of any form needs no executor code: its builder
 * fills the op's signature (network.h), each backend its row. */
typedef struct {
    int (*forward)(ptl_exec_ctx *ctx, const ptl_net_call *c);
    int (*backward)(ptl_exec_ctx *ctx, const ptl_net_call *c);
    size_t (*scratch_bytes)(const ptl_net_call *c); /* the layer scratch it needs (NULL: none) */
    int overwrites; /* 1: its backward overwrites its input's gradient whatever accumulate says (an op of one
                     * whole input); the executor then has it write the backward's scratch and adds that */
    int slices;     /* net_plan.h's PTL_NET_SLICE_* its kernels take: inputs (and their gradients) read at
                     * in[j].c0 in rows of in[j].c, the output written at out[0].c0 (out[0].nc channels) in rows
                     * of out[0].c, for a Concat built in place */
    size_t (*kept_bytes)(const ptl_net_call *c); /* the bytes of its own that a training forward keeps for the
                                                    * backward, at the call's `kept` (NULL: none) */
} ptl_net_layer;

/* Add and Concat (copy_layers.c): rows written once over the calling backend's add, accumulate, copy and
 * channel_copy; every backend's table holds them (PTL_NET_COPY_LAYERS), but for CUDA's own Add row (an Add into
 * a Concat's slice in one launch, the same bits). */
int ptl_net_add_forward(ptl_exec_ctx *ctx, const ptl_net_call *c);
int ptl_net_add_backward(ptl_exec_ctx *ctx, const ptl_net_call *c);
int ptl_net_cat_forward(ptl_exec_ctx *ctx, const ptl_net_call *c);
int ptl_net_cat_backward(ptl_exec_ctx *ctx, const ptl_net_call *c);
#define PTL_NET_CAT_LAYER [PTL_OP_CAT] = {ptl_net_cat_forward, ptl_net_cat_backward, NULL, 0, PTL_NET_SLICE_IN}
#define PTL_NET_COPY_LAYERS                                                                                  \
    [PTL_OP_ADD] = {ptl_net_add_forward, ptl_net_add_backward, NULL, 0, PTL_NET_SLICE_OUT}, PTL_NET_CAT_LAYER

/* Where an argument's channels start in p (its activation or gradient; NULL stays NULL). */
static inline void *ptl_net_arg_at(void *p, const ptl_net_arg *a, ptl_dtype dt)
{
    return p ? (char *)p + (size_t)a->c0 * ptl_dtype_size(dt) : NULL;
}

/* Rows (n h w) of one value of call c. */
static inline int64_t ptl_net_arg_rows(const ptl_net_call *c, const ptl_net_arg *a)
{
    return (int64_t)c->B * a->h * a->w;
}

/* The NHWC dimensions of a call's first input, as the one-input kernels take them. */
#define PTL_NET_CALL_NHWC(c) (c)->B, (c)->in[0].h, (c)->in[0].w, (c)->in[0].c
/* For a row that takes slices (PTL_NET_SLICE_*): the dimensions of its input's channels, and where its input's
 * and its output's `field` (data or grad) start with their pixel strides. */
#define PTL_NET_CALL_NHWC_SLICE(c) (c)->B, (c)->in[0].h, (c)->in[0].w, (c)->in[0].nc
#define PTL_NET_IN_AT(c, field) ptl_net_arg_at((c)->in[0].field, &(c)->in[0], (c)->dt), (c)->in[0].c
#define PTL_NET_OUT_AT(c, field) ptl_net_arg_at((c)->out[0].field, &(c)->out[0], (c)->dt), (c)->out[0].c
/* Output k's data or grad, NULL where the op has no output k. */
#define PTL_NET_CALL_OUT(c, k, field) ((c)->nout > (k) ? (c)->out[k].field : NULL)

/* Which calls of a conv plan a workspace serves: all of them; the weight and bias gradients (a side queue's);
 * the forward and the input gradient (the queue whose weight and bias gradients run on a side queue). */
typedef enum { PTL_CONV_WS_ALL, PTL_CONV_WS_PARAM_GRADS, PTL_CONV_WS_DATA } ptl_conv_ws_part;

/* The backend table. Activations are in the compute dtype `dt`; BatchNorm parameters, running and
 * saved statistics, head outputs and output gradients in the master dtype. accumulate: 0 overwrites
 * (the first writer of a gradient), 1 adds. */
typedef struct ptl_net_backend {
    const char *name;
    ptl_device_type device;
    int cast_biases; /* 1: conv biases go through the compute-dtype copy (see the file comment) */

    /* makes ctx's device current for the calling thread (NULL: nothing to do) */
    int (*activate)(ptl_exec_ctx *ctx);
    /* memory: alloc hands out `bytes` (> 0) of device memory; copy is device to device and, like zero,
     * queued on the context's stream; upload/download copy to/from the host and wait */
    int (*alloc)(ptl_exec_ctx *ctx, size_t bytes, ptl_net_buf *b);
    void (*release)(ptl_exec_ctx *ctx, ptl_net_buf *b);
    int (*zero)(ptl_exec_ctx *ctx, void *p, size_t bytes);
    int (*copy)(ptl_exec_ctx *ctx, void *dst, const void *src, size_t bytes);
    int (*upload)(ptl_exec_ctx *ctx, void *dst, const void *host, size_t bytes);
    int (*download)(ptl_exec_ctx *ctx, void *host, const void *src, size_t bytes);

    /* per shape: the conv plans (desc + dtype + algorithm choice; bias[i]: whether plan i's forward adds
     * one; all n or none), their workspaces, the layer scratch */
    int (*conv_plans)(ptl_exec_ctx *ctx, int n, const ptl_conv2d_desc *d, ptl_dtype dt, const ptl_net_conv_opts *o,
                      const uint8_t *bias, void **plans);
    void (*conv_plan_free)(void *plan);
    size_t (*conv_workspace)(const void *plan, ptl_conv_ws_part part);
    size_t (*bn_scratch_bytes)(int64_t m, int c);                    /* NULL: none */
    int (*reserve_scratch)(ptl_exec_ctx *ctx, size_t bytes);         /* NULL: nothing to reserve */

    /* weights: wc[OHWI, dt] = params[OIHW] for every table entry; grads[OIHW] += wgc[OHWI], then wgc = 0 */
    int (*weight_cast)(ptl_exec_ctx *ctx, ptl_dtype dt, const ptl_wcast_table *t, const void *params, void *wc);
    int (*weight_grad)(ptl_exec_ctx *ctx, ptl_dtype dt, const ptl_wcast_table *t, void *wgc, void *grads);

    /* layers (the contracts of ../nn/<op>.h; dw and db add, dx overwrites) */
    int (*conv_forward)(ptl_exec_ctx *ctx, const void *plan, const void *x, const void *w, const void *bias, void *y,
                        void *ws, size_t ws_bytes);
    int (*conv_backward_input)(ptl_exec_ctx *ctx, const void *plan, const void *dy, const void *w, void *dx,
                               void *ws, size_t ws_bytes);
    /* dx += dL/dx (an input with several consumers); scratch, dx's size, for a plan that cannot add in one
     * call. NULL: conv_backward_input into the scratch, then accumulate. */
    int (*conv_backward_input_add)(ptl_exec_ctx *ctx, const void *plan, const void *dy, const void *w, void *dx,
                                   void *scratch, void *ws, size_t ws_bytes);
    int (*conv_backward_weight)(ptl_exec_ctx *ctx, const void *plan, const void *x, const void *dy, void *dw,
                                void *ws, size_t ws_bytes);
    int (*conv_backward_bias)(ptl_exec_ctx *ctx, const void *plan, const void *dy, void *db, void *ws,
                              size_t ws_bytes);
    /* ld: the row stride of y and dy (>= c; c but for a Concat built in place) */
    int (*batchnorm_forward)(ptl_exec_ctx *ctx, ptl_dtype dt, int64_t m, int c, const void *x, const void *gamma,
                             const void *beta, void *running_mean, void *running_var, int training, ptl_act act,
                             void *save_mean, void *save_invstd, void *y, int ld);
    /* a convolution without bias, then training-mode BatchNorm of its output z (NULL: the two calls above;
     * ptl_net_conv_batchnorm_forward chooses) */
    int (*conv_batchnorm_forward)(ptl_exec_ctx *ctx, const void *plan, const void *x, const void *w, void *z,
                                  void *ws, size_t ws_bytes, const void *gamma, const void *beta, void *running_mean,
                                  void *running_var, ptl_act act, void *save_mean, void *save_invstd, void *y,
                                  int ld);
    int (*batchnorm_backward)(ptl_exec_ctx *ctx, ptl_dtype dt, int64_t m, int c, const void *x, const void *dy,
                              int ld, const void *gamma, const void *beta, const void *save_mean,
                              const void *save_invstd, int training, ptl_act act, void *dx, void *dgamma, void *dbeta);
    int (*add)(ptl_exec_ctx *ctx, ptl_dtype dt, int64_t n, const void *a, const void *b, void *y);
    int (*accumulate)(ptl_exec_ctx *ctx, ptl_dtype dt, int64_t n, const void *x, void *y);
    int (*channel_copy)(ptl_exec_ctx *ctx, ptl_dtype dt, int64_t m, int c, const void *src, int src_c, int src_off,
                        void *dst, int dst_c, int dst_off, int accumulate);
    /* by op kind: every kind but the executor's own (the convolutions with their plans and weight copies,
     * the head's outputs): Add, Concat (PTL_NET_COPY_LAYERS), max-pool, upsample, attention */
    ptl_net_layer layer[PTL_NET_OP_KINDS];
    /* a level's map (B, hw, C) (compute dtype) <-> rows [a0, a0 + hw) of a (B, A, C) head output */
    int (*head_out)(ptl_exec_ctx *ctx, ptl_dtype dt, int B, int64_t hw, int C, int64_t A, int64_t a0,
                    const void *map, void *out);
    int (*head_grad)(ptl_exec_ctx *ctx, ptl_dtype dt, int B, int64_t hw, int C, int64_t A, int64_t a0,
                     const void *d_out, void *gmap, int accumulate);

    /* side queues (PTL_NET_SIDE_*; NULL: the backend has one queue, and the executor runs that work in
     * order, or defers it as late as it may run: the CPU stand-in of the queues). side_open gives the
     * context of side queue k, which runs beside ctx's (made on first use, owned by ctx); side_fork(k, from)
     * has it wait for everything queued so far on side queue `from` (-1: on ctx); side_mark(k, m) marks
     * what it has queued so far as its mark m (< PTL_NET_SIDE_MARKS); side_await(k, m, to) has side queue
     * `to` (-1: ctx's queue) wait for that mark. */
    int (*side_open)(ptl_exec_ctx *ctx, int k, ptl_exec_ctx **side);
    int (*side_fork)(ptl_exec_ctx *ctx, int k, int from);
    int (*side_mark)(ptl_exec_ctx *ctx, int k, int m);
    int (*side_await)(ptl_exec_ctx *ctx, int k, int m, int to);

    /* the recorder (../cuda/recorder.h; NULL: the backend records nothing) */
    int (*record)(struct ptl_net_exec *x, const void *images, int B, int H, int W, const void *const d_out[2][2],
                  const struct ptl_net_tail *tail);
    int (*replay)(struct ptl_net_exec *x, int part);
    int (*recorded)(struct ptl_net_exec *x);
    void (*recording_free)(ptl_net_recording *rec);
    void (*recording_nodes)(struct ptl_net_exec *x, int64_t nodes[3]);
} ptl_net_backend;

extern const ptl_net_backend ptl_net_backend_cpu;
/* conv_plans for a backend that makes its plans one at a time with one() (all n or none: drop() frees the
 * ones made before a failure). */
int ptl_net_conv_plans_each(int (*one)(ptl_exec_ctx *ctx, const ptl_conv2d_desc *d, ptl_dtype dt,
                                       const ptl_net_conv_opts *o, int bias, void **plan),
                            void (*drop)(void *plan), ptl_exec_ctx *ctx, int n, const ptl_conv2d_desc *d, ptl_dtype dt,
                            const ptl_net_conv_opts *o, const uint8_t *bias, void **plans);
/* z = conv(x, w) by `plan` (dtype dt, m output rows, c output channels), then y = BatchNorm(z) in training mode
 * (y's rows ld apart): through be->conv_batchnorm_forward where the backend has one, else its two calls. */
int ptl_net_conv_batchnorm_forward(const ptl_net_backend *be, ptl_exec_ctx *ctx, const void *plan, ptl_dtype dt,
                                   int64_t m, int c, const void *x, const void *w, void *z, void *ws, size_t ws_bytes,
                                   const void *gamma, const void *beta, void *running_mean, void *running_var,
                                   ptl_act act, void *save_mean, void *save_invstd, void *y, int ld);
/* dx += dL/dx by `plan` (dtype dt, n elements of dx; an input with several consumers): through
 * be->conv_backward_input_add where the backend has one, else the gradient into scratch (dx's size) and added. */
int ptl_net_conv_backward_input_add(const ptl_net_backend *be, ptl_exec_ctx *ctx, const void *plan, ptl_dtype dt,
                                    int64_t n, const void *dy, const void *w, void *dx, void *scratch, void *ws,
                                    size_t ws_bytes);
/* The convolution a plan of ptl_net_backend_cpu describes (for backends built on its plans). */
const ptl_conv2d_desc *ptl_net_cpu_plan_desc(const void *plan);
/* Blocks the CPU backend holds now, over all executors (tests check that nothing leaks). */
long ptl_net_cpu_live_blocks(void);
#ifdef PTL_WITH_CUDA
extern const ptl_net_backend ptl_net_backend_cuda;
#endif

/* The backward runs a conv's weight and bias gradients beside the rest of the step (on a backend with a
 * side_open, its second queue; on the CUDA backend a second stream, so that those kernels overlap the input
 * gradients of the steps after them): step t's are awaited at the start of step t + lag, and the layout keeps
 * what they read alive until then (net_plan.h); a branch's, on their own queue, by the branch's queue on its
 * own steps (below). Every kernel reads and writes what it would in order, so the bits do not depend on the
 * lag. PTL_NET_SIDE_LAG is the CUDA backend's default (the environment variable PTL_SIDE_LAG overrides it
 * when an executor is made; 0 runs everything in order on one stream). */
#define PTL_NET_SIDE_LAG 4
#define PTL_NET_SIDE_MAX_LAG 6

/* A queue's conv workspace is at most PTL_NET_QUEUE_WORKSPACE_LIMIT bytes (0: no limit), but for the branch
 * queues'. A conv whose weight and bias gradients need more runs them in order, not on the weight-gradient
 * queue; a conv outside the branches whose calls need more has its workspace in the arena, for its forward
 * and for its backward step alone (net_plan.h), where the values leave memory free then: in YOLO26 the stem,
 * whose cuDNN algorithms want ~25 MiB at batch 4, 640, and every other conv < 3 MiB. The environment variable
 * PTL_QUEUE_WORKSPACE_MIB overrides it when an executor is made (benchmark A/B), as PTL_CONV_WORKSPACE_MIB
 * does the conv plans' workspace_limit (no algorithm needing more), whose default is
 * PTL_NET_CONV_WORKSPACE_LIMIT. */
#define PTL_NET_QUEUE_WORKSPACE_LIMIT ((size_t)4 << 20)
#define PTL_NET_CONV_WORKSPACE_LIMIT ((size_t)0)

/* A network's branches (net_plan.h's ptl_net_branches: in YOLO26 the one-to-one head's chains of each level,
 * whose inputs are detached, and the one-to-many head's, which add into the neck's gradients) run forward
 * and backward on side queues beside the rest, the detached ones on one, the attached ones on another: the
 * forward forks each before the first op after its inputs' producers, in order of fork, and joins them at
 * its end; the backward forks them all at its start, in reverse, and joins each before its join op's step.
 * With a side lag, a branch's conv weight and bias gradients run on a queue of their own per kind
 * (_DETACHED_WGRAD, _ATTACHED_WGRAD), forked from the branch's queue after the conv's step and awaited by it
 * side_lag steps later (the layout keeps what they read alive until then), so that the branch's chain of
 * input gradients does not wait for them.
 * On by default on the CUDA backend (the environment variables PTL_SIDE_BRANCHES=0 turn them all off and
 * PTL_SIDE_ATTACHED=0 the attached ones, when an executor is made). Each queue has PTL_NET_SIDE_MARKS marks
 * (the weight-gradient queue one per lag step; a branch queue and its gradients' queue one per branch,
 * cycling). */
enum {
    PTL_NET_SIDE_WGRAD = 0,
    PTL_NET_SIDE_DETACHED = 1,
    PTL_NET_SIDE_ATTACHED = 2,
    PTL_NET_SIDE_DETACHED_WGRAD = 3,
    PTL_NET_SIDE_ATTACHED_WGRAD = 4,
    PTL_NET_SIDE_STREAMS = 5
};
#define PTL_NET_SIDE_MARKS PTL_NET_SIDE_MAX_LAG
/* Where calls are queued: the main queue (0) or side queue k's (1 + k). */
#define PTL_NET_QUEUES (1 + PTL_NET_SIDE_STREAMS)

/* Shape slots: PTL_NET_TRAIN_SHAPES for training-mode forwards (a fit's full batches and its partial
 * last batch), the rest for eval mode (validation's many shapes, prediction), so that validating never
 * evicts the training shapes (or their recording). */
#define PTL_NET_TRAIN_SHAPES 2
#define PTL_NET_SHAPES 3

/* The per-shape state of one slot. */
typedef struct {
    ptl_net_layout L;            /* B == 0: empty */
    ptl_net_buf arena, saved, out[2][2]; /* arena: activations, gradients, scratch (layout L) */
    ptl_net_buf kept;            /* the layer rows' kept bytes, op i's at kept_off[i] (-1: none) */
    int64_t *kept_off;
    size_t kept_bytes;
    ptl_net_buf ws[PTL_NET_QUEUES];     /* each queue's conv workspace, when it has one */
    size_t ws_bytes[PTL_NET_QUEUES];
    void **plans;                /* per op (convs only) */
    int warm;                    /* an eager forward and backward ran on these buffers (before recording) */
    uint64_t last_use;
    ptl_net_recording *rec;      /* the recorder's graphs for this shape, or NULL */
} ptl_net_slot;

typedef struct ptl_net_exec {
    /* the description (it must outlive the executor), and `net`, the description as the executor runs it:
     * `run`, a copy whose ops build the Concats in place where the backend's kernels allow
     * (ptl_net_exec_set_cat_in_place); its storage is the description's */
    const ptl_network *desc, *net;
    ptl_network run; /* its ops are the executor's own */
    int cat_in_place, cat_parts; /* on or off; the parts it places */
    const ptl_net_backend *be;
    ptl_exec_ctx *ctx;
    ptl_runtime *rt;
    ptl_device device;
    ptl_dtype mdt, cdt; /* master and compute dtypes */
    size_t msz, csz;
    int training, fwd_training, have_forward;
    int share; /* PTL_NET_SHARE_* flags: what shares memory (both by default; less for tests) */
    int grad;  /* 0: forwards keep nothing for a backward (their slots have forward-only layouts) */
    ptl_net_conv_opts opts;
    ptl_net_grad_plan gp;
    ptl_net_wtab wt;
    /* freezing (ptl_net_exec_set_frozen): per op its PTL_NET_FROZEN_* bits and whether its backward runs
     * (it trains a parameter or sends a gradient on that one needs); per value whether its gradient is needed
     * (it depends on a trainable parameter); the counts executor_info reports */
    uint8_t *op_frozen, *op_needed, *grad_needed;
    int nfrozen, backward_ops;

    /* master storage (aliasing the description's host storage when `aliased`); params and buffers may
     * point at other weights for a while (ptl_net_exec_use_weights), own_* are the executor's */
    int aliased;
    void *params, *grads, *buffers, *stats;
    void *own_params, *own_buffers;
    ptl_net_buf own[4]; /* params, grads, buffers, stats when allocated here */
    ptl_net_buf wc, wgc, wtab, wtiles;
    int wgc_dirty; /* a backward began and its weight_grad (which leaves wgc zero) has not run */
    ptl_wcast_table wtable; /* wt in the backend's memory */

    /* the backward's weight and bias gradients beside the rest (ptl_net_exec_set_side_lag): the lag, per
     * mark the op whose side work it waits for (-1: none); the branches (ptl_net_exec_set_branches): on, off
     * or early, the attached ones too or not, the network's branches; the side queues' contexts (NULL:
     * deferred on ctx) */
    int side_lag;
    size_t queue_ws_limit; /* PTL_NET_QUEUE_WORKSPACE_LIMIT's setting */
    int side_op[PTL_NET_SIDE_MAX_LAG];
    int branches, attached;
    ptl_net_branches br;
    ptl_exec_ctx *side[PTL_NET_SIDE_STREAMS];
    /* where the ops now running are queued: the context and its conv workspace; in_branch: 0, or 1 +
     * attached for a branch's ops (their queue's own scratch, weight gradients in order) */
    ptl_exec_ctx *q;
    void *q_ws;
    size_t q_ws_bytes;
    int in_branch;

    ptl_net_slot slot[PTL_NET_SHAPES];
    ptl_net_slot *cur; /* the current shape's slot */
    uint64_t clock;
} ptl_net_exec;

/* An executor of `net` on backend `be` (ctx: the device's context, NULL on the CPU) computing in
 * `compute`. alias_host: run on the description's own host storage (CPU, compute == net->dtype);
 * else master storage is allocated on the device (float32) and the host storage is uploaded. */
int ptl_net_exec_create(const ptl_network *net, const ptl_net_backend *be, ptl_exec_ctx *ctx, ptl_runtime *rt,
                        ptl_device device, ptl_dtype compute, int alias_host, ptl_net_exec **out);
void ptl_net_exec_free(ptl_net_exec *x);

/* Copies "params", "grads" or "buffers" between the executor's master storage and the description's
 * host storage (to_device 1: host -> executor); a no-op for aliased storage. Synchronous. */
int ptl_net_exec_sync(ptl_net_exec *x, const char *which, int to_device);

/* Makes the conv plans of `count` shapes (bhw: B, H, W each) now, in one request to the backend (the CUDA
 * backend makes a shape's missing plans concurrently and keeps them in its plan cache), so that the first
 * prepare of each finds them: for the shapes a fit will see, made while its images decode. forward_only:
 * the plans of those shapes' no-grad layouts (validation, prediction), else of their training layouts.
 * Changes no slot. */
int ptl_net_exec_plan(ptl_net_exec *x, int count, const int *bhw, int forward_only);

/* Makes (B, H, W) the current shape: switches to its slot among the current mode's, or fills the
 * empty / least recently used one (buffers, conv plans, layer scratch reserved). A no-op for the
 * current shape. H and W: positive multiples of 32. */
int ptl_net_exec_prepare(ptl_net_exec *x, int B, int H, int W);

/* Forward of images (B, H, W, 3) NHWC in the compute dtype on the executor's device; head outputs in
 * ptl_net_exec_output. Training mode normalises with batch statistics and updates the running ones. */
int ptl_net_exec_forward(ptl_net_exec *x, const void *images, int B, int H, int W);
/* Backward after a forward of the current shape: d_out[branch][0 boxes | 1 scores] in the master dtype
 * (NULL = zero). Parameter gradients add (+=) into the master gradient; d_images (compute dtype) is
 * written when not NULL, else the image gradient is not computed. */
int ptl_net_exec_backward(ptl_net_exec *x, const void *const d_out[2][2], void *d_images);

/* Frozen tensors (Ultralytics' freeze): frozen[e] is 0 or 1 for each of the description's n == nentries
 * tensors (NULL: none). A frozen parameter's gradient is never computed (it stays as it is in the
 * gradient buffer); an op whose buffers (a BatchNorm's running_mean and running_var) are frozen, all or none,
 * runs in eval mode in training forwards too (running statistics used, not updated; the eval backward). The
 * backward skips every gradient that no trainable parameter needs: an op's input gradient when nothing
 * upstream of it trains, a whole op when nothing in or before it trains; the image gradient still
 * flows through everything when d_images is asked. The writes left keep their order, so the trainable
 * parameters' gradients are bit-identical to an unfrozen backward's. Drops every slot's recording and
 * the last forward. */
/* bit k < PTL_NET_MAX_OP_PARAMS: the op's parameter k (network.h's PTL_CONV_* order for a conv) */
enum { PTL_NET_FROZEN_W = 1 << PTL_CONV_W, PTL_NET_FROZEN_BIAS = 1 << PTL_CONV_BIAS,
       PTL_NET_FROZEN_GAMMA = 1 << PTL_CONV_GAMMA, PTL_NET_FROZEN_BETA = 1 << PTL_CONV_BETA,
       PTL_NET_FROZEN_BN_EVAL = 1 << PTL_NET_MAX_OP_PARAMS };
int ptl_net_exec_set_frozen(ptl_net_exec *x, const uint8_t *frozen, int64_t n);

/* The BatchNorm mode of the next forward. A recording made in the other mode is kept, unused until
 * the mode is back. */
void ptl_net_exec_set_training(ptl_net_exec *x, int training);
/* Whether forwards keep what a backward needs (1, the default) or not (0: validation, prediction, with a
 * forward-only layout per shape, a fraction of the memory). A held shape of the other kind is remade. */
void ptl_net_exec_set_grad(ptl_net_exec *x, int grad);
/* Runs the following forwards on other parameters and BN statistics of the same layout and device
 * (the EMA's, for validation); NULL, NULL returns to the executor's own. A recording is kept, unused
 * while the weights are not those it was made with. */
void ptl_net_exec_use_weights(ptl_net_exec *x, void *params, void *buffers);
/* The side lag (0 .. PTL_NET_SIDE_MAX_LAG; above). On a backend without a second queue a lag > 0 defers the
 * weight and bias gradients as late as it allows, which checks the layout's lives on the CPU. Slots are
 * remade. */
int ptl_net_exec_set_side_lag(ptl_net_exec *x, int lag);
/* The queues' conv workspace limit (bytes, 0: none; PTL_NET_QUEUE_WORKSPACE_LIMIT); slots are remade. */
void ptl_net_exec_set_queue_workspace_limit(ptl_net_exec *x, size_t bytes);
/* Whether conv op i's weight and bias gradients (its plan p's) run beside the following steps (the side lag)
 * rather than in order: the lag is on, i is in no branch, and their workspace fits the queues' limit. */
int ptl_net_exec_param_grads_lag(const ptl_net_exec *x, int i, const void *p);
/* The branches on their side queues (1) or in order (0); on a backend without side queues 1 defers them to
 * the latest point each may run (its join) and PTL_NET_BRANCHES_EARLY runs them at the earliest (its fork,
 * the backward's start), the two ends of where a side queue may run them. attached: 0 keeps the attached
 * branches in order with the rest. Slots are remade. */
#define PTL_NET_BRANCHES_EARLY 2
int ptl_net_exec_set_branches(ptl_net_exec *x, int on, int attached);
/* Applies at the next prepare of each shape (slots are remade). */
void ptl_net_exec_set_conv_options(ptl_net_exec *x, const ptl_net_conv_opts *o);
/* What shares memory (PTL_NET_SHARE_* flags, net_plan.h); slots are remade. */
void ptl_net_exec_set_share_memory(ptl_net_exec *x, int share);
/* Concats built in place (1, the default; the environment variable PTL_CAT_IN_PLACE=0 turns it off when an
 * executor is made) or by copies (0): net_plan.h's ptl_net_cat_in_place, the same bits either way. The
 * plans are remade and so are the slots. */
int ptl_net_exec_set_cat_in_place(ptl_net_exec *x, int on);
int ptl_net_exec_zero_grad(ptl_net_exec *x);
/* The recorder of the backend (ARCHITECTURE.md §3; ../cuda/recorder.h): after an eager forward and
 * backward of the current shape, record captures (without running) one forward of `images` and one
 * backward of `d_out` into the shape's slot; replay runs the forward, the backward or both, one launch
 * each, on the same pointers. recorded: 1 while the current shape's recording is usable: made in the
 * current BN mode on the current weights (always 0 on a backend without a recorder, where record and
 * replay fail).
 *
 * A tail (may be NULL) is work queued on the stream right after the backward, such as the data-parallel
 * all-reduce: record then also captures a second backward with the tail in one graph, which
 * PTL_NET_REPLAY_BACKWARD_TAIL replays (the optimizer's steps; accumulation steps replay the backward
 * alone). The tail's run queues its work when called and must not synchronise; what it reads is baked
 * into the graph then. */
typedef struct ptl_net_tail {
    int (*run)(void *arg);
    void *arg;
} ptl_net_tail;
enum { PTL_NET_REPLAY_BOTH = 0, PTL_NET_REPLAY_FORWARD = 1, PTL_NET_REPLAY_BACKWARD = 2,
       PTL_NET_REPLAY_BACKWARD_TAIL = 3 };
int ptl_net_record(ptl_net_exec *x, const void *images, int B, int H, int W, const void *const d_out[2][2],
                   const ptl_net_tail *tail);
int ptl_net_replay(ptl_net_exec *x, int part);
int ptl_net_recorded(ptl_net_exec *x);
/* The node counts of the current shape's usable recording: forward, backward, backward with the tail (0
 * where there is none). */
void ptl_net_recording_nodes(ptl_net_exec *x, int64_t nodes[3]);
/* Drops every slot's recording. */
void ptl_net_exec_retire(ptl_net_exec *x);

/* The head output (branch 0 o2m, 1 o2o; which 0 boxes (B, A, 4), 1 scores (B, A, nc)) of the last
 * forward, master dtype, valid until the next forward of the shape or its slot's eviction. */
void *ptl_net_exec_output(ptl_net_exec *x, int branch, int which);
/* The current shape's network input (B, H, W, 3) in its slot (compute dtype): a forward of it copies nothing. */
void *ptl_net_exec_input(ptl_net_exec *x);
/* Bytes held: master storage, weight copies, tables; the per-shape slots. */
void ptl_net_exec_memory(const ptl_net_exec *x, int64_t *fixed_bytes, int64_t *shape_bytes);

#ifdef __cplusplus
}
#endif

#endif
