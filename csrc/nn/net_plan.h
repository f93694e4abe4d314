/* Plans derived from a network description, the same for every backend (executor.h): the gradient
 * plan, the weight-cast table and, per batch shape, the memory layout. Host memory only. */
#ifndef PTL_NN_NET_PLAN_H
#define PTL_NN_NET_PLAN_H

#include <stdint.h>

#include "network.h"
#include "weight_cast.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Elements every device sub-buffer starts on: 256 bytes for float32, what cuDNN's vectorised kernels
 * like (the CPU kernels do not care). */
#define PTL_NET_ALIGN 64

/* Who writes each gradient first in the backward (ops in reverse; backward step t runs op nops-1-t).
 * A write flagged in `first` overwrites; every other write adds. */
typedef struct {
    int nvalues, nops;
    int *born, *dies;  /* per value: steps of its first write and last read (-1: never written) */
    uint32_t *first;   /* per op: bit j = first writer of input j's gradient */
    int *zero_op;      /* per value: op before whose backward its slot is zeroed (-1: none) */
    int *zero_list, *zero_begin; /* values of zero_op grouped by op: zero_list[zero_begin[i] .. [i+1]) */
} ptl_net_grad_plan;

int ptl_net_grad_plan_build(const ptl_network *net, ptl_net_grad_plan *gp);
void ptl_net_grad_plan_free(ptl_net_grad_plan *gp);

/* The detached branches: the ops that no gradient connects to the rest of the network (the parts of the
 * backward's gradient graph other than its largest), which nothing outside them reads in the forward and
 * whose gradient writes are all first writes (so they need no scratch). Sets branch_op[i] (nops entries)
 * and returns the forward op they can fork before: the first after the producers of every value they
 * read from outside (nops: there is no branch). */
int ptl_net_branches(const ptl_network *net, const ptl_net_grad_plan *gp, uint8_t *branch_op);

/* Where each conv's weight (and bias, with cast_biases) sits in the compute-dtype copy. */
typedef struct {
    ptl_wcast_entry *tab;
    int n;
    int64_t total;        /* elements of the copy, padding included */
    int64_t *op_w, *op_b; /* per op: offset in the copy (-1: none) */
} ptl_net_wtab;

int ptl_net_wtab_build(const ptl_network *net, int cast_biases, ptl_net_wtab *wt);
void ptl_net_wtab_free(ptl_net_wtab *wt);

/* The memory layout of one batch shape (element offsets in the compute dtype). Activations, gradients and
 * the backward's scratch share one arena: a slot holds what is alive at the same time (the activations a
 * backward step reads die there, its gradients are born there). */
typedef struct {
    int B, H, W; /* B == 0: none */
    int64_t A, level_off[3];
    int64_t *voff;       /* per value: offset of its activation in the arena */
    int64_t *goff;       /* per value: offset of its gradient in the arena */
    int64_t scratch_off; /* the backward's scratch (as large as the largest value) in the arena */
    int64_t *saved_off;  /* per op: offset of what it saves for its backward (ptl_net_op_saved_numel) */
    int64_t arena_numel, saved_numel;
    int forward_only; /* built with PTL_NET_FORWARD_ONLY: no backward can follow its forwards */
} ptl_net_layout;

/* What shares memory in a layout (the rest keeps a slot of its own): gradients whose lives in the backward
 * do not overlap; activations whose lives do not overlap, with each other, the gradients and the scratch. */
enum { PTL_NET_SHARE_GRADIENTS = 1, PTL_NET_SHARE_ACTIVATIONS = 2 };
/* A layout for forwards alone (validation, prediction): every activation dies with its last forward
 * reader and nothing is kept for a backward. */
#define PTL_NET_FORWARD_ONLY 4

/* What runs beside the rest (executor.h), so that a layout keeps alive what it touches while it may run:
 * side_lag > 0: a conv's weight and bias gradients of backward step t may run as late as the start of step
 * t + side_lag, so what they read (the conv's input and its output's gradient) lives until the end of step
 * t + side_lag - 1; branch_op (NULL: none): the detached branches' ops, which may run anywhere from forward
 * op branch_fork to the forward's end, and in the backward anywhere from its start to the start of step
 * nops - branch_fork (where the ops before branch_fork begin), so everything they touch lives over those
 * whole spans. */
typedef struct {
    int side_lag;
    const uint8_t *branch_op;
    int branch_fork;
} ptl_net_concurrency;

/* Fills L (its arrays allocated by ptl_net_layout_alloc) for (B, H, W). flags: PTL_NET_SHARE_* (0 gives
 * every value and every gradient its own slot) and PTL_NET_FORWARD_ONLY; cc: NULL runs everything in
 * order. */
int ptl_net_layout_alloc(const ptl_network *net, ptl_net_layout *L);
int ptl_net_layout_build(const ptl_network *net, const ptl_net_grad_plan *gp, int B, int H, int W, int flags,
                         const ptl_net_concurrency *cc, ptl_net_layout *L);
void ptl_net_layout_free(ptl_net_layout *L);

/* Spatial size and row count (B*h*w) of value v in layout L. */
typedef struct {
    int h, w;
    int64_t m;
} ptl_net_dims;

static inline ptl_net_dims ptl_net_value_dims(const ptl_network *net, const ptl_net_layout *L, int v)
{
    ptl_net_dims d;
    d.h = L->H / net->values[v].down;
    d.w = L->W / net->values[v].down;
    d.m = (int64_t)L->B * d.h * d.w;
    return d;
}

#ifdef __cplusplus
}
#endif

#endif
