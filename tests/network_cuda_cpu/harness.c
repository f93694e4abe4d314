/* The CUDA network executor (csrc/cuda/network_cuda.c) run on the CPU: every CUDA call it makes is
 * replaced by the CPU layer kernel of the same op (float32), and the executor's own kernels
 * (network_cuda_kernels.cu) by loops over the same PTL_HD index helpers. Compared with the CPU network
 * (csrc/nn/network.c) this checks, without a GPU, everything the executor adds: the copied op list, the
 * activation offsets, the weight-cast table (OIHW <-> OHWI, padding), the gradient-slot plan (shared
 * slots, first writers overwriting, zeroed slots), the head copies, no_dx and the skipped image
 * gradient. "Device" memory is handed out filled with NaN bytes, so a read of anything not written
 * first shows.
 *
 *   harness            the check: shapes, both BN modes, either branch's gradient alone; exit 0 when
 *                      every result is bitwise equal to the CPU network's
 *   harness 1|2 SIZE   rounds every value the CUDA path stores to bfloat16 (1) or float16 (2) and
 *                      prints the errors against the CPU network at batch 2, SIZE x SIZE: what
 *                      low-precision storage alone costs (the calibration of tests/test_network_cuda.py)
 *
 * Built and run by tests/test_network_cuda.py::test_executor_on_cpu_stand_ins. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/conv2d.h"
#include "cuda/device.h"
#include "cuda/graph.h"
#include "cuda/network_cuda.h"
#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/batchnorm.h"
#include "nn/concat.h"
#include "nn/elementwise.h"
#include "nn/maxpool.h"
#include "nn/upsample.h"

/* ------------------------------------------------------------------ storage rounding (modes 1, 2) */

static int emu; /* 0: float32, 1: bfloat16, 2: float16 */

static float rnd1(float v)
{
    if (emu == 1) {
        uint32_t u;
        memcpy(&u, &v, 4);
        if ((u & 0x7f800000u) != 0x7f800000u)
            u += 0x7fffu + ((u >> 16) & 1u);
        u &= 0xffff0000u;
        memcpy(&v, &u, 4);
        return v;
    }
    if (emu == 2)
        return (float)(_Float16)v;
    return v;
}

static void rnd(void *p, int64_t n)
{
    float *f = p;
    for (int64_t i = 0; emu && i < n; i++)
        f[i] = rnd1(f[i]);
}

/* ------------------------------------------------------------------ runtime and allocator */

static ptl_cuda_ctx the_ctx;
static long live_blocks;

int ptl_cuda_ctx_get(ptl_runtime *rt, int device, ptl_cuda_ctx **out)
{
    (void)rt;
    (void)device;
    *out = &the_ctx;
    return 0;
}
int ptl_cuda_fail(const char *call, cudaError_t st) { return ptl_set_error(PTL_ERR_CUDA, "%s: %d", call, st); }
int ptl_cublas_fail(const char *call, cublasStatus_t st) { return ptl_set_error(PTL_ERR_CUDA, "%s: %d", call, st); }
int ptl_cudnn_fail(const char *call, cudnnStatus_t st) { return ptl_set_error(PTL_ERR_CUDA, "%s: %d", call, st); }
int ptl_cuda_launch_check(const char *kernel)
{
    (void)kernel;
    return 0;
}

int ptl_alloc_malloc(ptl_allocator *a, int pool, size_t n, void **ptr, void **block)
{
    (void)a;
    (void)pool;
    *ptr = *block = malloc(n);
    if (!*ptr)
        return ptl_set_error(PTL_ERR_MEMORY, "out of memory");
    memset(*ptr, 0xff, n);
    live_blocks++;
    return 0;
}
void ptl_alloc_free(ptl_allocator *a, void *block)
{
    (void)a;
    free(block);
    live_blocks--;
}
int ptl_copy_bytes(ptl_runtime *rt, void *dst, ptl_device dd, const void *src, ptl_device sd, size_t n)
{
    (void)rt;
    (void)dd;
    (void)sd;
    memcpy(dst, src, n);
    return 0;
}
int ptl_memset_device(ptl_runtime *rt, ptl_device dev, void *p, int v, size_t n)
{
    (void)rt;
    (void)dev;
    memset(p, v, n);
    return 0;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind k, cudaStream_t s)
{
    (void)k;
    (void)s;
    memcpy(dst, src, n);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t s)
{
    (void)s;
    memset(dst, v, n);
    return cudaSuccess;
}

/* The graph recorder needs a GPU: on these stand-ins a capture cannot start. */
int ptl_cuda_graph_begin(cudaStream_t stream)
{
    (void)stream;
    return ptl_set_error(PTL_ERR_RUNTIME, "no graph capture on the CPU stand-ins");
}
int ptl_cuda_graph_end(cudaStream_t stream, int keep, ptl_cuda_graph **out)
{
    (void)stream;
    (void)keep;
    *out = NULL;
    return 0;
}
int ptl_cuda_graph_launch(ptl_cuda_graph *g, cudaStream_t stream)
{
    (void)g;
    (void)stream;
    return -1;
}
void ptl_cuda_graph_destroy(ptl_cuda_graph *g) { (void)g; }

/* ------------------------------------------------------------------ convolution plans */

struct ptl_conv2d_plan {
    ptl_conv2d_desc d;
    int refs;
};
static long plans_made, plans_live;

ptl_conv2d_plan_opts ptl_conv2d_plan_opts_default(void)
{
    ptl_conv2d_plan_opts o = {1, 0, 0, 0};
    return o;
}
int ptl_conv2d_plan_create(struct ptl_cuda_ctx *ctx, const ptl_conv2d_desc *d, ptl_dtype dt,
                           const ptl_conv2d_plan_opts *o, ptl_conv2d_plan **out)
{
    (void)ctx;
    (void)dt;
    (void)o;
    *out = malloc(sizeof **out);
    if (!*out)
        return ptl_set_error(PTL_ERR_MEMORY, "out of memory");
    (*out)->d = *d;
    (*out)->refs = 1;
    plans_made++;
    plans_live++;
    return 0;
}
void ptl_conv2d_plan_retain(ptl_conv2d_plan *p) { p->refs++; }
int ptl_conv2d_plan_refs(const ptl_conv2d_plan *p) { return p->refs; }
void ptl_conv2d_plan_destroy(ptl_conv2d_plan *p)
{
    if (p && --p->refs == 0) {
        plans_live--;
        free(p);
    }
}
/* a size that differs per plan, so that the network must size its workspace by the largest */
size_t ptl_conv2d_plan_workspace(const ptl_conv2d_plan *p) { return 64 + (size_t)p->d.cout; }

static int ws_ok(const ptl_conv2d_plan *p, size_t have)
{
    return have >= ptl_conv2d_plan_workspace(p) ? 0 : ptl_set_error(PTL_ERR_VALUE, "workspace too small");
}
int ptl_conv2d_forward_cuda(struct ptl_cuda_ctx *c, const ptl_conv2d_plan *p, const void *x, const void *w,
                            const void *b, void *y, void *ws, size_t wsb)
{
    (void)c;
    (void)ws;
    if (ws_ok(p, wsb) || ptl_conv2d_forward(&p->d, PTL_FLOAT32, x, w, b, y))
        return -1;
    rnd(y, (int64_t)p->d.n * p->d.ho * p->d.wo * p->d.cout);
    return 0;
}
int ptl_conv2d_backward_input_cuda(struct ptl_cuda_ctx *c, const ptl_conv2d_plan *p, const void *dy, const void *w,
                                   void *dx, void *ws, size_t wsb)
{
    (void)c;
    (void)ws;
    if (ws_ok(p, wsb) || ptl_conv2d_backward_input(&p->d, PTL_FLOAT32, dy, w, dx))
        return -1;
    rnd(dx, (int64_t)p->d.n * p->d.h * p->d.w * p->d.cin);
    return 0;
}
int ptl_conv2d_backward_weight_cuda(struct ptl_cuda_ctx *c, const ptl_conv2d_plan *p, const void *x, const void *dy,
                                    void *dw, void *ws, size_t wsb)
{
    (void)c;
    (void)ws;
    if (ws_ok(p, wsb) || ptl_conv2d_backward_weight(&p->d, PTL_FLOAT32, x, dy, dw))
        return -1;
    rnd(dw, (int64_t)p->d.cout * p->d.k * p->d.k * (p->d.cin / p->d.groups));
    return 0;
}
int ptl_conv2d_backward_bias_cuda(struct ptl_cuda_ctx *c, const ptl_conv2d_plan *p, const void *dy, void *db,
                                  void *ws, size_t wsb)
{
    (void)c;
    (void)ws;
    if (ws_ok(p, wsb) || ptl_conv2d_backward_bias(&p->d, PTL_FLOAT32, dy, db))
        return -1;
    rnd(db, p->d.cout);
    return 0;
}
int ptl_layers_cuda_reserve(struct ptl_cuda_ctx *ctx, size_t bytes)
{
    (void)ctx;
    (void)bytes;
    return 0;
}
uint64_t ptl_layers_cuda_scratch_generation(struct ptl_cuda_ctx *ctx)
{
    (void)ctx;
    return 0;
}
size_t ptl_batchnorm_cuda_scratch_bytes(int64_t m, int c) { return (size_t)(m + c); }
size_t ptl_attention_cuda_scratch_bytes(ptl_dtype dt, int n, int heads)
{
    (void)dt;
    return (size_t)n * heads;
}

/* ------------------------------------------------------------------ layers */

int ptl_batchnorm_forward_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int64_t m, int c, const void *x, const void *g,
                               const void *b, void *rm, void *rv, int tr, ptl_act act, void *sm, void *si, void *y)
{
    (void)ctx;
    if (ptl_batchnorm_forward(dt, m, c, x, g, b, rm, rv, tr, act, sm, si, y))
        return -1;
    rnd(y, m * c);
    return 0;
}
int ptl_batchnorm_backward_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int64_t m, int c, const void *x,
                                const void *dy, const void *g, const void *b, const void *sm, const void *si, int tr,
                                ptl_act act, void *dx, void *dg, void *db)
{
    (void)ctx;
    if (ptl_batchnorm_backward(dt, m, c, x, dy, g, b, sm, si, tr, act, dx, dg, db))
        return -1;
    rnd(dx, m * c);
    return 0;
}
int ptl_add_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int64_t n, const void *a, const void *b, void *y)
{
    (void)ctx;
    if (ptl_add(dt, n, a, b, y))
        return -1;
    rnd(y, n);
    return 0;
}
int ptl_accumulate_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int64_t n, const void *x, void *y)
{
    (void)ctx;
    if (ptl_accumulate(dt, n, x, y))
        return -1;
    rnd(y, n);
    return 0;
}
int ptl_channel_copy_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int64_t m, int c, const void *src, int sc, int so,
                          void *dst, int dc, int dof, int acc)
{
    (void)ctx;
    if (ptl_channel_copy(dt, m, c, src, sc, so, dst, dc, dof, acc))
        return -1;
    rnd(dst, m * dc);
    return 0;
}
int ptl_maxpool5_forward_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int n, int h, int w, int c, const void *x,
                              void *y)
{
    (void)ctx;
    return ptl_maxpool5_forward(dt, n, h, w, c, x, y);
}
int ptl_maxpool5_backward_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int n, int h, int w, int c, const void *x,
                               const void *dy, void *dx, int acc)
{
    (void)ctx;
    if (ptl_maxpool5_backward(dt, n, h, w, c, x, dy, dx, acc))
        return -1;
    rnd(dx, (int64_t)n * h * w * c);
    return 0;
}
int ptl_upsample2x_forward_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int n, int h, int w, int c, const void *x,
                                void *y)
{
    (void)ctx;
    return ptl_upsample2x_forward(dt, n, h, w, c, x, y);
}
int ptl_upsample2x_backward_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int n, int h, int w, int c, const void *dy,
                                 void *dx, int acc)
{
    (void)ctx;
    if (ptl_upsample2x_backward(dt, n, h, w, c, dy, dx, acc))
        return -1;
    rnd(dx, (int64_t)n * h * w * c);
    return 0;
}
int ptl_attention_forward_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int b, int n, int heads, int kd, int hd,
                               const void *qkv, void *attn, void *o, void *v)
{
    (void)ctx;
    if (ptl_attention_forward(dt, b, n, heads, kd, hd, qkv, attn, o, v))
        return -1;
    rnd(attn, (int64_t)b * heads * n * n);
    rnd(o, (int64_t)b * n * heads * hd);
    if (v)
        rnd(v, (int64_t)b * n * heads * hd);
    return 0;
}
int ptl_attention_backward_cuda(struct ptl_cuda_ctx *ctx, ptl_dtype dt, int b, int n, int heads, int kd, int hd,
                                const void *qkv, const void *attn, const void *d_o, const void *dv, void *dqkv)
{
    (void)ctx;
    if (ptl_attention_backward(dt, b, n, heads, kd, hd, qkv, attn, d_o, dv, dqkv))
        return -1;
    rnd(dqkv, (int64_t)b * n * heads * (2 * kd + hd));
    return 0;
}

/* ------------------------------------------------------------------ network_cuda_kernels.cu */

int ptl_net_weight_cast_cuda(struct CUstream_st *s, ptl_dtype dt, const ptl_wcast_entry *tab, int n, int64_t total,
                             const float *src, void *dst)
{
    (void)s;
    (void)dt;
    for (int64_t i = 0; i < total; i++) {
        const ptl_wcast_entry *e = tab + ptl_wcast_find(tab, n, i);
        const int64_t k = ptl_wcast_src(e, i - e->dst);
        if (k >= 0)
            ((float *)dst)[i] = rnd1(src[k]);
    }
    return 0;
}
int ptl_net_weight_grad_cuda(struct CUstream_st *s, ptl_dtype dt, const ptl_wcast_entry *tab, int n, int64_t total,
                             const void *g, float *grad)
{
    (void)s;
    (void)dt;
    for (int64_t i = 0; i < total; i++) {
        const ptl_wcast_entry *e = tab + ptl_wcast_find(tab, n, i);
        const int64_t k = ptl_wcast_src(e, i - e->dst);
        if (k >= 0)
            grad[k] += ((const float *)g)[i];
    }
    return 0;
}
int ptl_net_head_out_cuda(struct CUstream_st *s, ptl_dtype dt, int B, int64_t hw, int C, int64_t A, int64_t a0,
                          const void *map, float *out)
{
    (void)s;
    (void)dt;
    for (int64_t i = 0; i < (int64_t)B * hw * C; i++)
        out[ptl_net_head_index(i, hw, C, A, a0)] = ((const float *)map)[i];
    return 0;
}
int ptl_net_head_grad_cuda(struct CUstream_st *s, ptl_dtype dt, int B, int64_t hw, int C, int64_t A, int64_t a0,
                           const float *d, void *gmap, int accumulate)
{
    (void)s;
    (void)dt;
    float *g = gmap;
    for (int64_t i = 0; i < (int64_t)B * hw * C; i++)
        g[i] = rnd1((accumulate ? g[i] : 0.0f) + d[ptl_net_head_index(i, hw, C, A, a0)]);
    return 0;
}

/* ------------------------------------------------------------------ the comparison */

static uint64_t rng_state = 88172645463325252ull;
static double urand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

/* |a - b| / |b| over n floats; sets *bad on a non-finite a. */
static double rel(const float *a, const float *b, int64_t n, int *bad)
{
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i]))
            *bad = 1;
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    return sqrt(d / (r > 0 ? r : 1e-300));
}

/* One forward + backward of both executors on the same random images and output gradients. mask: bit b
 * set = branch b gets a gradient. Returns 1 when (mode 0) anything differs in a single bit. */
static int run(ptl_network *cpu, ptl_network_cuda *g, int B, int H, int W, int training, int mask)
{
    const int64_t npix = (int64_t)B * H * W * 3;
    const int want_dimg = mask == 3; /* else the executor skips the image gradient */
    int bad = 0, same = 1;
    float *img = malloc(npix * 4), *imgq = malloc(npix * 4), *buf0 = malloc(cpu->nbuffers * 4);
    float *dc = malloc(npix * 4), *dg = malloc(npix * 4), *R[2][2] = {{NULL, NULL}, {NULL, NULL}};
    const void *Rp[2][2] = {{NULL, NULL}, {NULL, NULL}};
    if (!img || !imgq || !buf0 || !dc || !dg)
        return 1;
    cpu->training = training;
    ptl_network_cuda_set_training(g, training);
    for (int64_t i = 0; i < npix; i++)
        img[i] = imgq[i] = (float)urand();
    rnd(imgq, npix);
    memcpy(buf0, cpu->buffers, cpu->nbuffers * 4);
    if (ptl_network_forward(cpu, img, B, H, W) || ptl_network_cuda_forward(g, imgq, B, H, W)) {
        printf("forward: %s\n", ptl_error_message());
        return 1;
    }
    int Bq, Hq, Wq;
    int64_t A;
    ptl_network_cuda_shape(g, &Bq, &Hq, &Wq, &A);
    double oe = 0;
    for (int br = 0; br < 2; br++)
        for (int j = 0; j < 2; j++) {
            const int64_t n = (int64_t)B * A * (j ? cpu->nc : 4);
            const float *o = ptl_network_cuda_output(g, br, j);
            const double e = rel(o, cpu->out[br][j], n, &bad);
            oe = e > oe ? e : oe;
            same &= !memcmp(o, cpu->out[br][j], n * 4);
            R[br][j] = malloc(n * 4);
            for (int64_t i = 0; i < n; i++)
                R[br][j][i] = (float)(2 * urand() - 1);
            if ((mask >> br) & 1)
                Rp[br][j] = R[br][j];
        }
    /* the running-statistics update (training) or the untouched statistics (eval) */
    const float *gbuf = ptl_network_cuda_buffers(g);
    double be;
    same &= !memcmp(gbuf, cpu->buffers, cpu->nbuffers * 4);
    {
        float *d1 = malloc(cpu->nbuffers * 4), *d2 = malloc(cpu->nbuffers * 4);
        for (int64_t i = 0; i < cpu->nbuffers; i++) {
            d1[i] = training ? gbuf[i] - buf0[i] : gbuf[i];
            d2[i] = training ? ((float *)cpu->buffers)[i] - buf0[i] : ((float *)cpu->buffers)[i];
        }
        be = rel(d1, d2, cpu->nbuffers, &bad);
        free(d1);
        free(d2);
    }
    memset(cpu->grads, 0, cpu->nparams * 4);
    memset(ptl_network_cuda_grads(g), 0, cpu->nparams * 4);
    if (ptl_network_backward(cpu, Rp, dc) || ptl_network_cuda_backward(g, Rp, want_dimg ? dg : NULL)) {
        printf("backward: %s\n", ptl_error_message());
        return 1;
    }
    const double ge = rel(ptl_network_cuda_grads(g), cpu->grads, cpu->nparams, &bad);
    const double de = want_dimg ? rel(dg, dc, npix, &bad) : 0.0;
    same &= !memcmp(ptl_network_cuda_grads(g), cpu->grads, cpu->nparams * 4);
    if (want_dimg)
        same &= !memcmp(dg, dc, npix * 4);
    int64_t nz = 0;
    for (int64_t i = 0; i < cpu->nparams; i++)
        nz += ((float *)cpu->grads)[i] != 0;
    printf("B=%d %dx%d train=%d branches=%d: outputs %.2e, statistics %.2e, gradients %.2e (%lld of %lld nonzero), "
           "image gradient %.2e, bitwise %s, non-finite %d\n",
           B, H, W, training, mask, oe, be, ge, (long long)nz, (long long)cpu->nparams, de, same ? "yes" : "no", bad);
    free(img);
    free(imgq);
    free(buf0);
    free(dc);
    free(dg);
    for (int br = 0; br < 2; br++)
        for (int j = 0; j < 2; j++)
            free(R[br][j]);
    return emu ? bad : !same || bad;
}

int main(int argc, char **argv)
{
    emu = argc > 1 ? atoi(argv[1]) : 0;
    const int size = argc > 2 ? atoi(argv[2]) : 640;
    ptl_network *cpu = ptl_network_create('n', 80, PTL_FLOAT32, 3);
    if (!cpu) {
        printf("%s\n", ptl_error_message());
        return 1;
    }
    /* random BN affine parameters and statistics (the shape of tests/test_network_cuda.py's state) */
    for (int i = 0; i < cpu->nentries; i++) {
        const ptl_net_entry *e = &cpu->entries[i];
        float *base = (float *)(e->is_buffer ? cpu->buffers : cpu->params) + e->offset;
        if (e->init == PTL_INIT_ONES)
            for (int64_t j = 0; j < e->numel; j++)
                base[j] = (float)(0.5 + urand());
        else if (e->init == PTL_INIT_ZEROS)
            for (int64_t j = 0; j < e->numel; j++)
                base[j] = (float)(0.6 * urand() - 0.3);
    }
    ptl_network_cuda *g = ptl_network_cuda_create(NULL, cpu, 0, PTL_FLOAT32);
    if (!g) {
        printf("create: %s\n", ptl_error_message());
        return 1;
    }
    int fails = 0;
    if (emu) {
        fails += run(cpu, g, 2, size, size, 1, 3);
        fails += run(cpu, g, 2, size, size, 0, 3);
    } else {
        fails += run(cpu, g, 2, 96, 128, 1, 3);
        fails += run(cpu, g, 2, 96, 128, 0, 3);
        fails += run(cpu, g, 1, 64, 64, 1, 3); /* a new shape: buffers and plans remade */
        fails += run(cpu, g, 1, 64, 64, 1, 2); /* one-to-one gradient only */
        fails += run(cpu, g, 1, 64, 64, 0, 1); /* one-to-many gradient only, no image gradient */
        fails += run(cpu, g, 2, 96, 128, 1, 3); /* back to the first shape: its slot, kept */
        fails += run(cpu, g, 1, 32, 64, 1, 3);  /* a third shape takes the least recently used slot */
        fails += run(cpu, g, 2, 96, 128, 0, 3);
        fails += run(cpu, g, 1, 64, 64, 1, 3);  /* evicted before: buffers made again, plans from the cache */
        /* a second network of shapes seen before (the EMA model's) makes no plan: the context's cache has them */
        const long made = plans_made;
        ptl_network_cuda *g2 = ptl_network_cuda_create(NULL, cpu, 0, PTL_FLOAT32);
        fails += !g2 || run(cpu, g2, 2, 96, 128, 0, 3) || run(cpu, g2, 1, 32, 64, 1, 3);
        ptl_network_cuda_free(g2);
        if (plans_made != made) {
            printf("%ld plans made again for shapes the cache holds\n", plans_made - made);
            fails++;
        }
    }
    ptl_network_cuda_free(g);
    /* what the cache still holds: its own reference and nothing else */
    int64_t held, made;
    ptl_conv2d_plan_cache_stats(&the_ctx, &held, &made);
    if (made != plans_made || held != plans_live) {
        printf("plan cache: %lld held, %lld made; stand-ins: %ld live, %ld made\n", (long long)held,
               (long long)made, plans_live, plans_made);
        fails++;
    }
    ptl_network_free(cpu);
    if (live_blocks)
        printf("%ld device blocks leaked\n", live_blocks);
    printf("%s\n", fails || live_blocks ? "FAILED" : "OK");
    return fails || live_blocks;
}
