/* The optimizer on flat buffers (spec §4-§6): gradient unscaling and clipping, MuSGD / SGD / AdamW,
 * the dynamic loss scaler and the EMA.
 *
 * Every named parameter is a view (offset, shape) into one flat buffer; gradients, optimizer state and
 * the EMA use the same layout. Python (ptl/optim.py) turns the parameter table into a few int64
 * tables, so a step is a handful of launches over "chunks" (pieces of at most PTL_OPT_CHUNK elements
 * of one parameter), not one launch per tensor:
 *   ptab  [P][PTL_PT_NCOLS]  one row per parameter (columns below)
 *   call  [C][3]             (start, length, parameter) for every chunk of every parameter
 *   cmuon [Cm][3]            the chunks of the orthogonalised (Muon) parameters only, matrix-ordered
 *   sgtab [S][7]             host: (rows, cols, count, x offset, a offset, x stride, a stride) per
 *                            same-shape batch of the Newton-Schulz work, in the wide orientation
 *                            (rows <= cols); offsets and strides are multiples of PTL_NS_ALIGN
 * The CUDA Newton-Schulz workspace holds four bfloat16 arenas (X, P: tx elements; A, Bm: ta elements);
 * each arena keeps every matrix of every batch contiguously, so each product of one iteration is one
 * strided-batched GEMM per shape.
 *
 * The scalar state lives in a small buffer `scalars` (dtype of the parameters, on their device), so the
 * found-inf flag, the clip coefficient and the scale update never leave the device. */
#ifndef PTL_OPTIM_H
#define PTL_OPTIM_H

#include <math.h>

#include "../ops/fpmath.h"
#include "../ops/half.h"
#include "../ptl.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PTL_OPT_CHUNK 4096
/* Newton-Schulz matrices start 512-byte aligned, as fresh torch tensors do: cuBLAS chooses its kernel by
 * alignment, and a different kernel sums in a different order (measured: 5 of yolo26n's 126 matrices
 * differed from torch without it). */
#define PTL_NS_ALIGN 256
#define PTL_OPT_MAX_GROUPS 16

enum { PTL_OPT_SGD = 0, PTL_OPT_MUON = 1, PTL_OPT_ADAMW = 2 };

/* Defaults of the step's settings (spec §4-§6, §10); Python reads them from ptl._C (OPTIM_*). */
#define PTL_OPT_MUON_W 0.2          /* MuSGD shares of the orthogonalised and the SGD update */
#define PTL_OPT_SGD_W 1.0
#define PTL_OPT_BETA2 0.999         /* AdamW */
#define PTL_OPT_EPS 1e-8
#define PTL_OPT_MAX_NORM 10.0       /* gradient clip */
#define PTL_OPT_GROWTH_FACTOR 2.0   /* loss scaler */
#define PTL_OPT_BACKOFF_FACTOR 0.5
#define PTL_OPT_GROWTH_INTERVAL 2000

/* Columns of ptab. */
enum {
    PTL_PT_OFF = 0,  /* element offset into the flat buffer */
    PTL_PT_NUMEL,    /* elements */
    PTL_PT_ROWS,     /* rows of the 2-D view (out channels) */
    PTL_PT_COLS,     /* numel / rows */
    PTL_PT_GROUP,    /* parameter group */
    PTL_PT_XOFF,     /* offset of its matrix in the X arena; -1 when not orthogonalised */
    PTL_PT_TALL,     /* 1: rows > cols, the arena holds the transpose */
    PTL_PT_MIDX,     /* index among the orthogonalised matrices; -1 otherwise */
    PTL_PT_D2,       /* size(-2) and size(-1) of the original shape: the Muon scale factor */
    PTL_PT_D1,
    PTL_PT_CFIRST,   /* its first chunk in cmuon and the number of them */
    PTL_PT_CCOUNT,
    PTL_PT_FROZEN,   /* 1: never updated (freeze): in no chunk of call or cmuon, XOFF and MIDX -1 */
    PTL_PT_NCOLS
};

/* Entries of the scalar-state buffer. */
enum {
    PTL_OPT_S_SCALE = 0,  /* loss scale */
    PTL_OPT_S_GROWTH,     /* clean steps since the last scale change */
    PTL_OPT_S_FOUND_INF,  /* 1 when the last step found an Inf/NaN gradient (and was skipped) */
    PTL_OPT_S_NORM,       /* global gradient norm after unscaling, before clipping */
    PTL_OPT_S_COEF,       /* clip coefficient applied (1 when not clipped) */
    PTL_OPT_S_STEP,       /* optimizer steps applied (AdamW bias correction) */
    PTL_OPT_S_SKIPPED,    /* steps skipped for Inf/NaN */
    PTL_OPT_S_N = 8
};

typedef struct {
    int ngroups;
    int kind[PTL_OPT_MAX_GROUPS];
    double lr[PTL_OPT_MAX_GROUPS];
    double momentum[PTL_OPT_MAX_GROUPS]; /* SGD/Muon momentum; AdamW beta1 */
    double wd[PTL_OPT_MAX_GROUPS];
    double muon_w, sgd_w; /* MuSGD shares (0.2 / 1.0) */
    double beta2, eps;    /* AdamW */
    int nesterov;
    double max_norm;      /* clip the global norm to this; <= 0: no clipping */
    int scaler;           /* dynamic loss scaling: unscale, skip on Inf/NaN, update the scale */
    double growth_factor, backoff_factor;
    int growth_interval;
    int ns_bf16;          /* CPU only: round every Newton-Schulz stage to bfloat16 like CUDA */
    int zero_grad;        /* zero the gradient buffer after the step */
    int world;            /* >= 1: the gradients hold the sum over this many ranks (data parallelism); the
                           * step reads their mean */
} ptl_optim_hp;

/* The Newton-Schulz quintic coefficients (spec §4.4). */
#define PTL_NS_A 3.4445
#define PTL_NS_B (-4.7750)
#define PTL_NS_C 2.0315
#define PTL_NS_STEPS 5
#define PTL_NS_EPS 1e-7

PTL_HD float ptl_round_bf16(float x) { return ptl_bits_to_f32(ptl_bf16_to_f32_bits(ptl_f32_to_bf16_bits(ptl_f32_to_bits(x)))); }

/* torch.lerp's two-sided formula (exact at both ends). The float32 form fuses the product and the sum
 * into one fmaf, as torch's CUDA kernels are compiled (measured: bit-identical to torch.lerp on an
 * H200); the bf16 Newton-Schulz that follows amplifies any last-bit difference of its input. */
PTL_HD float ptl_lerpf(float a, float b, float w)
{
    return fabsf(w) < 0.5f ? fmaf(w, PTL_FSUB(b, a), a) : fmaf(-PTL_FSUB(b, a), PTL_FSUB(1.0f, w), b);
}

PTL_HD double ptl_lerpd(double a, double b, double w)
{
    return fabs(w) < 0.5 ? a + w * (b - a) : b - (b - a) * (1.0 - w);
}

/* The Muon scale factor sqrt(max(1, size(-2) / size(-1))) of the original gradient shape. */
PTL_HD double ptl_muon_factor(int64_t d2, int64_t d1)
{
    double r = (double)d2 / (double)d1;
    return sqrt(r > 1.0 ? r : 1.0);
}

/* Per-element update rules, written once for float32 (CPU reference and CUDA give the same bits) and
 * once for float64 (CPU reference only). Each float32 operation rounds like the matching torch CUDA op:
 * `x.add(y, alpha=a)`, addcdiv and lerp are one fused multiply-add there, mul_/add_ pairs are not. */

/* Muon momentum as 8.4.190's muon_update: m <- m mu, then m += (1 - mu) g (one fused step); returns the
 * direction u (nesterov: u = m mu, then u += (1 - mu) g). */
PTL_HD float ptl_muon_momentum_f(float *m, float g, float one_minus_mu, float mu, int nesterov)
{
    float mm = fmaf(one_minus_mu, g, PTL_FMUL(*m, mu));
    *m = mm;
    return nesterov ? fmaf(one_minus_mu, g, PTL_FMUL(mm, mu)) : mm;
}

PTL_HD double ptl_muon_momentum_d(double *m, double g, double one_minus_mu, double mu, int nesterov)
{
    double mm = *m * mu + one_minus_mu * g;
    *m = mm;
    return nesterov ? mm * mu + one_minus_mu * g : mm;
}

/* SGD with momentum (decay folded into the gradient): g' = g + wd p; v <- mu v + g';
 * p <- p + alpha (g' + mu v) (nesterov) or p + alpha v, with alpha = -(lr * share). */
PTL_HD void ptl_sgd_elem_f(float *p, float *v, float g, float mu, float wd, float alpha, int nesterov)
{
    float pp = *p;
    float gp = wd != 0.0f ? fmaf(wd, pp, g) : g;
    float vv = PTL_FADD(PTL_FMUL(*v, mu), gp);
    float d = nesterov ? fmaf(mu, vv, gp) : vv;
    *v = vv;
    *p = fmaf(alpha, d, pp);
}

PTL_HD void ptl_sgd_elem_d(double *p, double *v, double g, double mu, double wd, double alpha, int nesterov)
{
    double pp = *p;
    double gp = wd != 0.0 ? g + wd * pp : g;
    double vv = *v * mu + gp;
    double d = nesterov ? gp + mu * vv : vv;
    *v = vv;
    *p = pp + alpha * d;
}

/* AdamW (decoupled decay, torch's foreach form): p <- p (1 - lr wd); m <- lerp(m, g, 1 - b1);
 * v <- b2 v + (1 - b2) (g g);
 * p <- p - step_size m / (sqrt(v) / sqrt(bc2) + eps). */
typedef struct {
    double decay_mul, one_minus_b1, b2, one_minus_b2, bc2_sqrt, eps, neg_step_size;
    int decay;
} ptl_adamw_coef;

PTL_HD ptl_adamw_coef ptl_adamw_coefs(double lr, double b1, double b2, double eps, double wd, double step)
{
    ptl_adamw_coef c;
    double bc1 = 1.0 - pow(b1, step), bc2 = 1.0 - pow(b2, step);
    c.decay = wd != 0.0;
    c.decay_mul = 1.0 - lr * wd;
    c.one_minus_b1 = 1.0 - b1;
    c.b2 = b2;
    c.one_minus_b2 = 1.0 - b2;
    c.bc2_sqrt = sqrt(bc2);
    c.eps = eps;
    c.neg_step_size = -(lr / bc1);
    return c;
}

PTL_HD void ptl_adamw_elem_f(float *p, float *m, float *v, float g, const ptl_adamw_coef *c)
{
    float pp = c->decay ? PTL_FMUL(*p, (float)c->decay_mul) : *p;
    float mm = ptl_lerpf(*m, g, (float)c->one_minus_b1);
    float vv = fmaf((float)c->one_minus_b2, PTL_FMUL(g, g), PTL_FMUL(*v, (float)c->b2));
    float den = PTL_FADD(PTL_FDIV(PTL_FSQRT(vv), (float)c->bc2_sqrt), (float)c->eps);
    *m = mm;
    *v = vv;
    *p = fmaf((float)c->neg_step_size, PTL_FDIV(mm, den), pp);
}

PTL_HD void ptl_adamw_elem_d(double *p, double *m, double *v, double g, const ptl_adamw_coef *c)
{
    double pp = c->decay ? *p * c->decay_mul : *p;
    double mm = ptl_lerpd(*m, g, c->one_minus_b1);
    double vv = *v * c->b2 + c->one_minus_b2 * g * g;
    double den = sqrt(vv) / c->bc2_sqrt + c->eps;
    *m = mm;
    *v = vv;
    *p = pp + c->neg_step_size * (mm / den);
}

/* The factor every gradient is read with before clipping: 1 / (loss scale x ranks), rounded once to float32
 * (scale is 1 without the loss scaler; with world > 1 the gradients hold the sum over the ranks, so this
 * unscales and averages in one multiplication). */
PTL_HD float ptl_grad_inv_scale_f(double scale, int world) { return (float)(1.0 / (scale * (double)world)); }

/* The gradient actually used: unscaled, then clipped (two roundings, as torch's unscale_ and clip). */
PTL_HD float ptl_grad_used_f(float g, float inv_scale, float coef) { return PTL_FMUL(PTL_FMUL(g, inv_scale), coef); }

/* EMA as 8.4.190's ModelEMA: e <- lerp(e, m, 1 - d) (torch._foreach_lerp_). */
PTL_HD float ptl_ema_elem_f(float e, float m, float one_minus_d) { return ptl_lerpf(e, m, one_minus_d); }

/* The GradScaler update (torch's _amp_update_scale_), on float32 or float64 values held in doubles. */
PTL_HD void ptl_scaler_update(double *scale, double *growth, int found_inf, double growth_factor,
                              double backoff_factor, int growth_interval, int f32)
{
    if (found_inf) {
        *scale = f32 ? (double)(float)(*scale * backoff_factor) : *scale * backoff_factor;
        *growth = 0;
    } else if (*growth + 1 >= growth_interval) {
        double ns = f32 ? (double)(float)(*scale * growth_factor) : *scale * growth_factor;
        if (isfinite(ns))
            *scale = ns;
        *growth = 0;
    } else {
        *growth += 1;
    }
}

typedef struct {
    void *params, *grads;     /* flat buffers, n elements */
    void *state1, *state2;    /* Muon m / AdamW m; SGD v / AdamW v (state1 may be NULL without them) */
    void *scalars;            /* PTL_OPT_S_N entries */
    int64_t n;
    ptl_dtype dtype;          /* float32, or float64 on the CPU */
    const int64_t *ptab, *call, *cmuon, *sgtab;
    int64_t nparams, nchunks, nmuon_chunks, nsg, nmuon;
    int64_t tx, ta;           /* Newton-Schulz arena sizes (elements) */
    void *ws_bf16;            /* CUDA: 2 tx + 2 ta bfloat16 */
    void *ws_f64;             /* CUDA: nchunks + nmuon_chunks + nmuon doubles */
} ptl_optim_buffers;

/* Replay of the Newton-Schulz work (whose shapes and buffers never change for one optimizer) from a CUDA
 * graph: the first step runs eagerly (it loads cuBLAS's kernels), the second is captured, later ones
 * replay. A capture that fails leaves the optimizer eager for good (state PTL_NSG_FAILED). */
enum { PTL_NSG_EAGER = 0, PTL_NSG_REPLAY = 1, PTL_NSG_FAILED = 2 };
typedef struct ptl_ns_lanes ptl_ns_lanes; /* the Newton-Schulz products' streams (newton_schulz.cu) */
#define PTL_NS_LANES 8
typedef struct {
    void *exec; /* cudaGraphExec_t */
    int state, eager_runs;
    ptl_ns_lanes *lanes; /* made at the first step; NULL: one stream (PTL_NS_LANES=0, or they could not be made) */
    char why[160];
} ptl_ns_graph;

struct ptl_cuda_ctx;
/* The checks a step on `dev` runs first (settings, sizes, workspaces; on the CPU also the tables);
 * -1 naming the argument. */
int ptl_optim_check(const ptl_optim_buffers *b, const ptl_optim_hp *hp, ptl_device_type dev);
/* One optimizer step on ctx's device (NULL: the CPU): unscale, clip, update (skipped on Inf/NaN with the
 * scaler), scale update, zero the gradients. g: the Newton-Schulz replay slot (CUDA; may be NULL).
 * After its checks pass, a step writes nothing before it can no longer fail (but by a device fault). */
int ptl_optim_step(struct ptl_cuda_ctx *ctx, const ptl_optim_buffers *b, const ptl_optim_hp *hp, ptl_ns_graph *g);
/* ema <- lerp(ema, model, 1 - d) over n elements on ctx's device (NULL: the CPU). */
int ptl_ema_check(ptl_device_type dev, ptl_dtype dt, double decay);
int ptl_ema_update(struct ptl_cuda_ctx *ctx, void *ema, const void *model, int64_t n, ptl_dtype dt, double decay);
/* The backends of the two (called by them after the checks). */
int ptl_optim_step_cpu(const ptl_optim_buffers *b, const ptl_optim_hp *hp);
int ptl_ema_update_cpu(void *ema, const void *model, int64_t n, ptl_dtype dt, double decay);
/* Batched NS5 of float32 matrices x [batch][rows][cols] into out (same shape); bf16: round every stage. */
int ptl_newton_schulz_cpu(const float *x, float *out, int64_t batch, int64_t rows, int64_t cols, int bf16);
/* The stages of one matrix's NS5 in the wide orientation (x: r x c, r <= c); work holds 3 r^2 + r c. */
void ptl_ns5_normalise_f32(float *x, int64_t n, int bf16);
void ptl_ns5_normalise_f64(double *x, int64_t n);
void ptl_ns5_iterate_f32(float *x, int64_t r, int64_t c, int bf16, float *work);
void ptl_ns5_iterate_f64(double *x, int64_t r, int64_t c, double *work);
/* Sum of squares and the clip/scale bookkeeping shared by the CPU step (grad_clip.c). */
int ptl_grad_stats_cpu(const ptl_optim_buffers *b, const ptl_optim_hp *hp, double *inv_scale, double *coef);


#ifdef PTL_WITH_CUDA
struct CUstream_st;
struct cublasContext;
/* g may be NULL (always eager). */
int ptl_optim_step_cuda(struct CUstream_st *stream, struct cublasContext *cublas, const ptl_optim_buffers *b,
                        const ptl_optim_hp *hp, ptl_ns_graph *g);
void ptl_ns_graph_release(ptl_ns_graph *g);
int ptl_ema_update_cuda(struct CUstream_st *stream, float *ema, const float *model, int64_t n, double decay);
/* Runs NS5 in place on the X arena of ws (layout as in the file comment); sgtab on the host. lanes (NULL: none)
 * run each stage's products beside each other, with the same bits. */
int ptl_newton_schulz_arena_cuda(struct CUstream_st *stream, struct cublasContext *cublas, ptl_ns_lanes *lanes,
                                 uint16_t *ws, int64_t tx, int64_t ta, const int64_t *sgtab, int64_t nsg);
/* The lanes on the current device (their streams at the greatest priority, a cuBLAS handle each). */
int ptl_ns_lanes_create(ptl_ns_lanes **out);
void ptl_ns_lanes_destroy(ptl_ns_lanes *l);
/* Standalone batched NS5 of float32 matrices (tests, benchmarks); ws holds 2 tx + 2 ta bf16 with
 * tx = batch * xs, ta = batch * as, xs and as = rows * cols and min(rows, cols)^2 rounded up to
 * PTL_NS_ALIGN; norms holds `batch` floats. */
int ptl_newton_schulz_cuda(struct CUstream_st *stream, struct cublasContext *cublas, const float *x, float *out,
                           int64_t batch, int64_t rows, int64_t cols, uint16_t *ws, float *norms);
/* Gradient statistics on the device: writes S[NORM], S[COEF], S[FOUND_INF] (grad_clip.cu). */
int ptl_grad_stats_cuda(struct CUstream_st *stream, const ptl_optim_buffers *b, const ptl_optim_hp *hp);
#endif

#ifdef __cplusplus
}
#endif

#endif
