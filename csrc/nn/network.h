/* The YOLO26 detection network's description: builder (scale table, names, flat buffers,
 * initialisation) and the explicit list of layer records (ARCHITECTURE.md §1, spec §1-2). It is
 * executed by the network executor (executor.h) on the CPU or a CUDA backend.
 *
 * Layout:
 *   - parameters: ONE flat buffer, one gradient buffer of the same layout, and one flat buffer of
 *     BatchNorm running statistics ("buffers"). Every named tensor is a view (offset, shape) into
 *     its buffer, in Ultralytics state_dict order; names are the state_dict keys
 *     (`model.0.conv.weight`, `model.0.bn.running_var`, ...). Convolution weights keep PyTorch's
 *     (c_out, c_in/groups, kh, kw) layout so a state_dict entry is a plain copy.
 *     `num_batches_tracked` is not stored: with a fixed momentum it has no effect (§1.1).
 *   - values are NHWC tensors at 1/`down` of the input resolution; the executor lays them out per
 *     (batch, height, width).
 *   - head outputs: boxes (B, A, 4) (l, t, r, b in grid units) and scores (B, A, nc) logits, per
 *     branch (0 = one-to-many, 1 = one-to-one); A = sum over P3, P4, P5 of H_i*W_i, row-major.
 *
 * The description's host storage (params, grads, buffers) is in its dtype, float32 (training) or
 * float64 (gradient checks); the CPU executor runs on it directly. The one-to-one head's first convs
 * send no gradient to their input (grad_in 0): its loss never reaches the neck. */
#ifndef PTL_NN_NETWORK_H
#define PTL_NN_NETWORK_H

#include <stdint.h>

#include "../ptl.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PTL_NET_NAME_LEN 80
#define PTL_NET_MAX_PARTS 8
#define PTL_NET_MAX_CLS_WIDTH 65536 /* far above any YOLO26's (100 to 384); keeps sizes in int range */

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
} ptl_net_value;

typedef enum {
    PTL_OP_CONV,      /* conv (no bias) -> BN -> optional SiLU */
    PTL_OP_CONV_BIAS, /* plain 1x1 conv with bias (Detect outputs) */
    PTL_OP_ADD,       /* out = in 0 + in 1 */
    PTL_OP_CAT,       /* out = the inputs' channel ranges one after the other (also C2f's split) */
    PTL_OP_POOL,      /* 5x5 stride 1 max-pool, padding 2 */
    PTL_OP_UP,        /* nearest x2 */
    PTL_OP_ATTN,      /* from a qkv tensor: out = softmax(scale q^T k) v per head, out2 = dense v */
    PTL_OP_HEAD       /* copy a level's box/class map into the (B, A, C) head output */
} ptl_net_op_kind;
#define PTL_NET_OP_KINDS (PTL_OP_HEAD + 1)

/* Channels [c0, c0 + nc) of value `value`. */
typedef struct {
    int value, c0, nc;
} ptl_net_part;

#define PTL_NET_MAX_OP_PARAMS 4
#define PTL_NET_MAX_OP_BUFFERS 2
/* Where a conv op's tensors sit in its param / buffer lists. */
enum { PTL_CONV_W = 0, PTL_CONV_GAMMA = 1, PTL_CONV_BIAS = 1, PTL_CONV_BETA = 2 };
enum { PTL_BN_RUNNING_MEAN = 0, PTL_BN_RUNNING_VAR = 1 };

/* One op. Its signature has one form for every kind: the gradient plan, the memory layouts, freezing and the
 * executor's layer rows read nothing else, so a new kind fills it in its builder and needs none of them
 * changed (the kind's own fields below are for the kernels and the executor's own cases). */
typedef struct {
    ptl_net_op_kind kind;
    int layer;
    int nin;
    ptl_net_part ins[PTL_NET_MAX_PARTS]; /* the inputs: the channels each op reads of each value */
    int out, out2;                       /* the outputs (-1: none; an op without outputs writes the head's) */
    /* out_nc > 0: the op writes its output into channels [out_c0, out_c0 + out_nc) of value `out`, a
     * Concat's output built in place (net_plan.h's ptl_net_cat_in_place); 0: the whole value */
    int out_c0, out_nc;
    int z; /* an inner value (-1: none): the forward writes it, the op's own backward reads it and its gradient */
    uint8_t grad_in; /* bit j: the backward writes (or adds) input j's gradient */
    uint8_t keep_in; /* bit j: the backward reads input j's activation (kept from the forward) */
    int nparams, nbuffers;
    int64_t param[PTL_NET_MAX_OP_PARAMS];   /* offsets into params (the gradient at the same offset of grads) */
    int64_t buffer[PTL_NET_MAX_OP_BUFFERS]; /* into buffers (running statistics: frozen, the op runs in eval mode) */
    /* conv: z is the pre-BatchNorm output of a PTL_OP_CONV; stat_off the saved batch mean/invstd (executor) */
    int cin, cout, k, s, g, act;
    int64_t stat_off;
    /* attention */
    int heads, kd, hd;
    /* head */
    int branch, level, box; /* box: 1 = boxes (4 channels), 0 = scores (nc channels) */
} ptl_net_op;

typedef struct ptl_network {
    char scale;
    int nc;
    int cls_width;   /* channels of the Detect class branch (cc), both heads */
    ptl_dtype dtype; /* PTL_FLOAT32 or PTL_FLOAT64 */
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

    /* Flat host storage in `dtype`, owned by the network. */
    void *params, *grads, *buffers;
    int input; /* value id of the image (B, H, W, 3) */
} ptl_network;

/* Builds a network for scale 'n','s','m','l','x' and `nc` classes, initialised per spec §1.7 from
 * `seed`. cls_width: the class branch's width; 0 takes spec §1.5's max(ch0, min(nc, 100)) (another
 * width holds weights whose branch was sized for another class count, as Ultralytics' transfer keeps
 * it). dtype: PTL_FLOAT32 or PTL_FLOAT64 (CPU). Returns NULL after ptl_set_error on failure. */
ptl_network *ptl_network_create(char scale, int nc, int cls_width, ptl_dtype dtype, uint64_t seed);
void ptl_network_free(ptl_network *net);

/* Re-draws every parameter and resets the BN statistics (spec §1.7). */
void ptl_network_init(ptl_network *net, uint64_t seed);

/* The op kind's name in the op description (network_ops: "conv", "maxpool5", ...). */
const char *ptl_net_op_kind_name(ptl_net_op_kind kind);

/* Elements of the buffer op keeps per batch shape from its forward for its backward (attention's
 * probabilities), with its first input of h x w positions in a batch of B; 0: none. */
int64_t ptl_net_op_saved_numel(const ptl_net_op *op, int B, int h, int w);

/* Per-layer parameter count of spec layer `layer` (0..23). */
int64_t ptl_network_layer_params(const ptl_network *net, int layer);

#ifdef __cplusplus
}
#endif

#endif
