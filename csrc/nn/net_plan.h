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
static inline int64_t ptl_net_align_up(int64_t n) { return (n + PTL_NET_ALIGN - 1) / PTL_NET_ALIGN * PTL_NET_ALIGN; }

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

/* Branches: groups of ops whose results only the network's outputs read, so that they may run beside the
 * rest (executor.h). A branch is made of chains (ops joined through values that have one reader) that
 * nothing outside them reads, grouped by the values they read from outside. Detached: it writes no
 * gradient outside itself (YOLO26's one-to-one head, one branch per level: its inputs are detached).
 * Attached: it does (the one-to-many head, one branch per level, adds into the neck's gradients), and each
 * such write of it comes before the others of that gradient in the backward's order.
 * In the forward a branch may run from forward op `fork` (its inputs are ready) to the forward's end; in
 * the backward from its start to the start of op `join`'s backward step (-1: the backward's end): for an
 * attached branch the first step outside it that writes or reads a gradient it writes, for a detached one
 * the step of op fork - 1, where the ops before it begin. */
typedef struct {
    int fork, join, attached;
    int first, last; /* its first and last op */
} ptl_net_branch;

#define PTL_NET_MAX_BRANCHES 64
typedef struct {
    int n;
    uint8_t *op; /* per op: 0, or 1 + the index of its branch */
    ptl_net_branch b[PTL_NET_MAX_BRANCHES]; /* in order of fork, then of first op */
} ptl_net_branches;

int ptl_net_branches_find(const ptl_network *net, ptl_net_branches *br);
void ptl_net_branches_free(ptl_net_branches *br);

/* Concat built in place. A value P that a Concat copies whole into its output V is instead written by P's
 * producer straight into its channels of V, and read there by P's other readers, when every kernel involved
 * takes channel slices (per op kind, `slices`: PTL_NET_SLICE_IN, its kernels read slices of their inputs
 * and write their gradients'; PTL_NET_SLICE_OUT, they write a slice of their output and read its
 * gradient's), and when the Concat is the first to write P's gradient in the backward (P's other readers
 * that send it a gradient come before it), so that every gradient gets the same additions in the same order
 * and the bits are those of the copies. The Concat keeps the part, reading V's own channels (no gradient, no
 * activation kept), which its row then skips. Writes the rewritten ops (net->nops of them) into ops; returns
 * the number of parts placed. */
enum { PTL_NET_SLICE_IN = 1, PTL_NET_SLICE_OUT = 2 };
int ptl_net_cat_in_place(const ptl_network *net, const uint8_t slices[PTL_NET_OP_KINDS], ptl_net_op *ops);

/* Where each conv's weight (and bias, with cast_biases) sits in the compute-dtype copy. */
typedef struct {
    ptl_wcast_entry *tab;
    ptl_wcast_tile *tiles; /* the records cut for the CUDA kernels */
    int n, ntiles;
    int64_t total;         /* elements of the copy, padding included */
    int64_t *op_w, *op_b;  /* per op: offset in the copy (-1: none) */
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
    int64_t branch_scratch_off[2]; /* the detached and the attached branches' queues' own scratch */
    int64_t *saved_off;  /* per op: offset of what it saves for its backward (ptl_net_op_saved_numel) */
    int64_t *ws_off, *ws_numel; /* per op, forward (2 i) and backward (2 i + 1): its conv workspace in the
                                 * arena, for that step alone (ws_numel 0: in its queue's workspace) */
    int64_t arena_numel, saved_numel;
    int forward_only; /* built with PTL_NET_FORWARD_ONLY: no backward can follow its forwards */
    int grad_aliases; /* the inputs' gradients that share an Add's output's slot (net_plan.c's add_aliases) */
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
 * t + side_lag - 1 (a branch conv's on its branch's clock); br (NULL: none): the branches, each on the side queue of its kind (the attached ones
 * only with `attached`), anywhere from its fork to the forward's end and from the backward's start to its
 * join, so everything they touch lives over those whole spans. */
typedef struct {
    int side_lag;
    const ptl_net_branches *br;
    int attached;
} ptl_net_concurrency;

/* Fills L (its arrays allocated by ptl_net_layout_alloc) for (B, H, W). flags: PTL_NET_SHARE_* (0 gives
 * every value and every gradient its own slot) and PTL_NET_FORWARD_ONLY; cc: NULL runs everything in
 * order; op_ws (NULL: none): per op, the elements of its forward's (2 i) and its backward step's (2 i + 1)
 * conv workspace to place in the arena (ops in order on the main queue only), living for that step alone,
 * so that a rare large workspace takes memory the values leave free then. */
int ptl_net_layout_alloc(const ptl_network *net, ptl_net_layout *L);
int ptl_net_layout_build(const ptl_network *net, const ptl_net_grad_plan *gp, int B, int H, int W, int flags,
                         const ptl_net_concurrency *cc, const int64_t *op_ws, ptl_net_layout *L);
void ptl_net_layout_free(ptl_net_layout *L);

/* The branch op i runs in beside the rest under cc (-1: none). */
static inline int ptl_net_branch_of(const ptl_net_concurrency *cc, int i)
{
    if (!cc || !cc->br || !cc->br->op[i])
        return -1;
    const int b = cc->br->op[i] - 1;
    return cc->br->b[b].attached && !cc->attached ? -1 : b;
}

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
