/* The YOLO26 detection network: builder (scale table, names, flat buffers, initialisation) and the
 * CPU forward/backward over an explicit list of layer records (ARCHITECTURE.md §1, spec §1-2).
 *
 * Layout:
 *   - parameters: ONE flat buffer, one gradient buffer of the same layout, and one flat buffer of
 *     BatchNorm running statistics ("buffers"). Every named tensor is a view (offset, shape) into
 *     its buffer, in Ultralytics state_dict order; names are the state_dict keys
 *     (`model.0.conv.weight`, `model.0.bn.running_var`, ...). Convolution weights keep PyTorch's
 *     (c_out, c_in/groups, kh, kw) layout so a state_dict entry is a plain copy.
 *     `num_batches_tracked` is not stored: with a fixed momentum it has no effect (§1.1).
 *   - activations are NHWC; one arena per (batch, height, width) sized up front and reused.
 *   - head outputs: boxes (B, A, 4) (l, t, r, b in grid units) and scores (B, A, nc) logits, per
 *     branch (0 = one-to-many, 1 = one-to-one); A = sum over P3, P4, P5 of H_i*W_i, row-major.
 *
 * The CPU network computes in one dtype, float32 (training) or float64 (gradient checks): its
 * parameter, gradient and buffer storage, activations and outputs all use that dtype.
 *
 * Execution: the ops run in list order (forward) and reverse order (backward), calling the layer
 * kernels of this folder. Every op output is its own value in the arena (nothing is recomputed
 * except SiLU inside the fused BN backward and max-pool argmaxes); the backward zeroes the
 * activation-gradient arena, then each op adds into its inputs' gradients, except that a conv or
 * attention may write its input gradient directly when it is the first to reach it (dx_direct).
 * Conv weights are converted OIHW -> OHWI (the kernels' layout) on every call, like the cast of
 * master weights in a mixed-precision forward. The one-to-one head's first convs have no_dx set:
 * its loss never reaches the neck. */
#ifndef PTL_NN_NETWORK_H
#define PTL_NN_NETWORK_H

#include <stdint.h>

#include "../ptl.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PTL_NET_NAME_LEN 80
#define PTL_NET_MAX_PARTS 8

typedef struct {
    char name[PTL_NET_NAME_LEN];
    int is_buffer;  /* 1: BN running statistic (in `buffers`), 0: parameter (in `params`) */
    int64_t offset; /* elements into its flat buffer */
    int64_t numel;
    int ndim;
    int64_t shape[4];
    int layer;    /* spec §1.3 layer index (0..23) */
    int init;     /* PTL_INIT_* */
    double bound; /* PTL_INIT_UNIFORM: U(-bound, bound) */
    int head;     /* 0: not in Detect, 1: one-to-many head, 2: one-to-one head */
    int level;    /* Detect level (0..2) of a final bias */
} ptl_net_entry;

enum { PTL_INIT_UNIFORM, PTL_INIT_ONES, PTL_INIT_ZEROS, PTL_INIT_BOX_BIAS, PTL_INIT_CLS_BIAS };

/* A tensor of the graph: NHWC with C channels at 1/`down` of the input resolution. */
typedef struct {
    int C;
    int down;
    int64_t off;  /* elements into the activation arena (set by ptl_network_prepare) */
    int64_t goff; /* elements into the activation-gradient arena */
} ptl_net_value;

typedef enum {
    PTL_OP_CONV,      /* conv (no bias) -> BN -> optional SiLU */
    PTL_OP_CONV_BIAS, /* plain 1x1 conv with bias (Detect outputs) */
    PTL_OP_ADD,       /* out = in + in2 */
    PTL_OP_CAT,       /* out = channel concat of channel ranges of values (also C2f's split) */
    PTL_OP_POOL,      /* 5x5 stride 1 max-pool, padding 2 */
    PTL_OP_UP,        /* nearest x2 */
    PTL_OP_ATTN,      /* from a qkv tensor: out = softmax(scale q^T k) v per head, out2 = dense v */
    PTL_OP_HEAD       /* copy a level's box/class map into the (B, A, C) head output */
} ptl_net_op_kind;

typedef struct {
    int value, c0, nc;
} ptl_net_part;

typedef struct {
    ptl_net_op_kind kind;
    int layer;
    int in, in2, out, out2;
    int no_dx;     /* 1: no gradient flows to `in` (detached o2o inputs) */
    int dx_direct; /* 1: the backward may overwrite grad(in) (nothing has added to it yet) */
    /* conv */
    int cin, cout, k, s, g, act;
    int64_t w_off, gamma_off, beta_off, bias_off; /* into params */
    int64_t rmean_off, rvar_off;                  /* into buffers */
    int64_t stat_off;                             /* into the saved batch mean/invstd arena */
    int z;                                        /* the saved pre-BN conv output (value id) */
    /* cat */
    int nparts;
    ptl_net_part parts[PTL_NET_MAX_PARTS];
    /* attention */
    int heads, kd, hd;
    int64_t p_off; /* saved softmax probabilities, per sample and head N*N, into the attn arena */
    /* head */
    int branch, level, box; /* box: 1 = boxes (4 channels), 0 = scores (nc channels) */
} ptl_net_op;

typedef struct ptl_network {
    char scale;
    int nc;
    ptl_dtype dtype; /* PTL_FLOAT32 or PTL_FLOAT64 */
    int training;
    int stride[3]; /* P3, P4, P5 */
    int feat[3];   /* value ids of P3, P4, P5 */
    int ch[3];     /* their channels */
    int layer_out[24];

    int nentries, cap_entries;
    ptl_net_entry *entries;
    int64_t nparams, nbuffers, nstats;

    int nvalues, cap_values;
    ptl_net_value *values;
    int nops, cap_ops;
    ptl_net_op *ops;

    /* Flat storage in `dtype`, owned by the network. */
    void *params, *grads, *buffers;
    void *stats; /* saved batch mean and invstd per BN channel (train-mode forward) */

    /* Per (batch, height, width): set by ptl_network_prepare. */
    int B, H, W;
    int have_forward; /* a forward of this shape succeeded (backward may run) */
    int fwd_training; /* the BN mode of that forward, which its backward must use */
    int64_t A;
    int64_t level_off[3]; /* anchor offset of each level */
    int64_t level_hw[3];
    int64_t act_numel, attn_numel, max_value_numel;
    void *act, *gact, *attn;
    void *scratch; /* one value's worth: a conv/attention dx to be added into a shared gradient */
    void *out[2][2]; /* [branch][0 = boxes (B,A,4), 1 = scores (B,A,nc)] */
    int input;       /* value id of the image (B, H, W, 3) */
    int64_t wmax;
    void *wbuf; /* 3 x wmax: a conv weight in OHWI, its OHWI gradient, that gradient back in OIHW */
} ptl_network;

/* Builds a network for scale 'n','s','m','l','x' and `nc` classes, initialised per spec §1.7 from
 * `seed`. dtype: PTL_FLOAT32 or PTL_FLOAT64 (CPU). Returns NULL after ptl_set_error on failure. */
ptl_network *ptl_network_create(char scale, int nc, ptl_dtype dtype, uint64_t seed);
void ptl_network_free(ptl_network *net);

/* Re-draws every parameter and resets the BN statistics (spec §1.7). */
void ptl_network_init(ptl_network *net, uint64_t seed);

/* Sizes and (re)allocates the activation arena and head outputs for a batch shape; a no-op when the
 * shape is unchanged. H and W must be positive multiples of 32. */
int ptl_network_prepare(ptl_network *net, int B, int H, int W);

/* Forward on NHWC images (B, H, W, 3) in the network dtype (already normalised to [0, 1]).
 * Training mode normalises with batch statistics and updates the running statistics. Results in
 * net->out. Calls ptl_network_prepare. */
int ptl_network_forward(ptl_network *net, const void *images, int B, int H, int W);

/* Backward after a training- or eval-mode forward of the same shape: d_out[branch][0] is
 * d loss/d boxes (B, A, 4), d_out[branch][1] d loss/d scores (B, A, nc); a NULL entry means zero.
 * Parameter gradients accumulate into net->grads (+=). When d_images is not NULL the gradient
 * with respect to the input images (B, H, W, 3) is written there (=). */
int ptl_network_backward(ptl_network *net, const void *const d_out[2][2], void *d_images);

/* Per-layer parameter count of spec layer `layer` (0..23). */
int64_t ptl_network_layer_params(const ptl_network *net, int layer);

#ifdef __cplusplus
}
#endif

#endif
