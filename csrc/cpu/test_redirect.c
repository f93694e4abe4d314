/* Convolution plans made on first use per (shape, bias) and kept until the redirect is removed; one
 * workspace grown to the largest need. Allocating on a shape's first call is fine here: this is a test
 * bridge, not the executor. */
#include "test_redirect.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attention.h"
#include "batchnorm.h"
#include "conv2d.h"
#include "elementwise.h"
#include "maxpool.h"

typedef struct {
    ptl_conv2d_desc d;
    int bias;
    ptl_cpu_conv2d_plan *plan;
} entry;

static double seconds[PTL_CPU_REDIRECT_ENTRIES];
static int64_t calls[PTL_CPU_REDIRECT_ENTRIES];

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Runs `call` and adds its wall time to entry `e`'s total. */
#define TIMED(e, call)                                                                                       \
    do {                                                                                                     \
        const double t0_ = now();                                                                            \
        const int rc_ = (call);                                                                              \
        seconds[e] += now() - t0_;                                                                           \
        calls[e]++;                                                                                          \
        return rc_;                                                                                          \
    } while (0)

static entry *entries;
static int nentries, cap;
static void *workspace;
static size_t workspace_bytes;

static int reserve(size_t need)
{
    if (need <= workspace_bytes)
        return 0;
    void *grown = realloc(workspace, need);
    if (!grown)
        return ptl_set_error(PTL_ERR_MEMORY, "cpu test redirect: out of memory");
    workspace = grown;
    workspace_bytes = need;
    return 0;
}

/* The plan for d with (bias = 1) or without a bias; bias < 0 takes either (the gradients need none). */
static const ptl_cpu_conv2d_plan *plan_for(const ptl_conv2d_desc *d, int bias)
{
    for (int i = 0; i < nentries; i++)
        if ((bias < 0 || entries[i].bias == bias) && !memcmp(&entries[i].d, d, sizeof *d))
            return entries[i].plan;
    if (nentries == cap) {
        entry *grown = realloc(entries, sizeof *entries * (cap ? 2 * cap : 64));
        if (!grown) {
            ptl_set_error(PTL_ERR_MEMORY, "cpu test redirect: out of memory");
            return NULL;
        }
        entries = grown;
        cap = cap ? 2 * cap : 64;
    }
    entry *e = &entries[nentries];
    const ptl_cpu_conv2d_opts o = {PTL_CPU_WEIGHTS_OHWI, bias > 0, PTL_CPU_CONV_ALL};
    e->d = *d;
    e->bias = bias > 0;
    if (ptl_cpu_conv2d_plan_create(d, &o, &e->plan))
        return NULL;
    if (reserve(ptl_cpu_conv2d_plan_workspace(e->plan))) {
        ptl_cpu_conv2d_plan_destroy(e->plan);
        return NULL;
    }
    nentries++;
    return e->plan;
}

static int conv_forward(const ptl_conv2d_desc *d, const float *x, const float *wt, const float *bias, float *y)
{
    const ptl_cpu_conv2d_plan *p = plan_for(d, bias != NULL);
    if (!p)
        return -1;
    TIMED(0, ptl_cpu_conv2d_forward(p, x, wt, bias, y, workspace, workspace_bytes));
}

static int conv_backward_input(const ptl_conv2d_desc *d, const float *dy, const float *wt, float *dx)
{
    const ptl_cpu_conv2d_plan *p = plan_for(d, -1);
    if (!p)
        return -1;
    TIMED(1, ptl_cpu_conv2d_backward_input(p, dy, wt, dx, workspace, workspace_bytes));
}

static int conv_backward_weight(const ptl_conv2d_desc *d, const float *x, const float *dy, float *dwt)
{
    const ptl_cpu_conv2d_plan *p = plan_for(d, -1);
    if (!p)
        return -1;
    TIMED(2, ptl_cpu_conv2d_backward_weight(p, x, dy, dwt, workspace, workspace_bytes));
}

static int bn_forward(int64_t m, int c, const float *x, const float *gamma, const float *beta, float *running_mean,
                      float *running_var, int training, ptl_act act, float *save_mean, float *save_invstd, float *y)
{
    if (reserve(ptl_cpu_batchnorm_workspace(m, c)))
        return -1;
    TIMED(3, ptl_cpu_batchnorm_forward(m, c, x, gamma, beta, running_mean, running_var, training, act, save_mean,
                                       save_invstd, y, workspace, workspace_bytes));
}

static int bn_backward(int64_t m, int c, const float *x, const float *dy, const float *gamma, const float *beta,
                       const float *save_mean, const float *save_invstd, int training, ptl_act act, float *dx,
                       float *dgamma, float *dbeta)
{
    if (reserve(ptl_cpu_batchnorm_workspace(m, c)))
        return -1;
    TIMED(4, ptl_cpu_batchnorm_backward(m, c, x, dy, gamma, beta, save_mean, save_invstd, training, act, dx,
                                        dgamma, dbeta, workspace, workspace_bytes));
}

static int attn_forward(int b, int n, int heads, int kd, int hd, const float *qkv, float *attn, float *o, float *v)
{
    if (reserve(ptl_cpu_attention_workspace(b, n, heads, kd, hd)))
        return -1;
    TIMED(5, ptl_cpu_attention_forward(b, n, heads, kd, hd, qkv, attn, o, v, workspace, workspace_bytes));
}

static int attn_backward(int b, int n, int heads, int kd, int hd, const float *qkv, const float *attn,
                         const float *d_o, const float *dv, float *dqkv)
{
    if (reserve(ptl_cpu_attention_workspace(b, n, heads, kd, hd)))
        return -1;
    TIMED(6, ptl_cpu_attention_backward(b, n, heads, kd, hd, qkv, attn, d_o, dv, dqkv, workspace, workspace_bytes));
}

static int add(int64_t n, const float *a, const float *b, float *y) { TIMED(7, ptl_cpu_add(n, a, b, y)); }

static int accumulate(int64_t n, const float *x, float *y) { TIMED(8, ptl_cpu_accumulate(n, x, y)); }

static int channel_copy(int64_t m, int c, const float *src, int src_c, int src_off, float *dst, int dst_c,
                        int dst_off, int acc)
{
    TIMED(9, ptl_cpu_channel_copy(m, c, src, src_c, src_off, dst, dst_c, dst_off, acc));
}

static int pool_forward(int n, int h, int w, int c, const float *x, float *y)
{
    TIMED(10, ptl_cpu_maxpool5_forward(n, h, w, c, x, y));
}

static int pool_backward(int n, int h, int w, int c, const float *x, const float *dy, float *dx, int acc)
{
    TIMED(11, ptl_cpu_maxpool5_backward(n, h, w, c, x, dy, dx, acc));
}

static ptl_cpu_redirect ops;

int ptl_cpu_test_redirect(int kinds)
{
    if (kinds & ~PTL_CPU_REDIRECT_ALL)
        return ptl_set_error(PTL_ERR_VALUE, "cpu test redirect: unknown kinds %d", kinds);
    if (kinds) {
        if (!ptl_cpu_conv2d_available())
            return ptl_set_error(PTL_ERR_RUNTIME, "cpu test redirect: this ptl was built without oneDNN");
        const int conv = kinds & PTL_CPU_REDIRECT_CONV, bn = kinds & PTL_CPU_REDIRECT_BATCHNORM;
        const int attn = kinds & PTL_CPU_REDIRECT_ATTENTION, elem = kinds & PTL_CPU_REDIRECT_ELEMENTWISE;
        const int pool = kinds & PTL_CPU_REDIRECT_MAXPOOL;
        ops = (ptl_cpu_redirect){conv ? conv_forward : NULL,
                                 conv ? conv_backward_input : NULL,
                                 conv ? conv_backward_weight : NULL,
                                 bn ? bn_forward : NULL,
                                 bn ? bn_backward : NULL,
                                 attn ? attn_forward : NULL,
                                 attn ? attn_backward : NULL,
                                 elem ? add : NULL,
                                 elem ? accumulate : NULL,
                                 elem ? channel_copy : NULL,
                                 pool ? pool_forward : NULL,
                                 pool ? pool_backward : NULL};
        ptl_cpu_test_redirect_ops = &ops;
        memset(seconds, 0, sizeof seconds);
        memset(calls, 0, sizeof calls);
        return 0;
    }
    ptl_cpu_test_redirect_ops = NULL;
    for (int i = 0; i < nentries; i++)
        ptl_cpu_conv2d_plan_destroy(entries[i].plan);
    free(entries);
    free(workspace);
    entries = NULL;
    workspace = NULL;
    nentries = cap = 0;
    workspace_bytes = 0;
    return 0;
}

void ptl_cpu_test_redirect_stats(double secs[PTL_CPU_REDIRECT_ENTRIES], int64_t ncalls[PTL_CPU_REDIRECT_ENTRIES])
{
    memcpy(secs, seconds, sizeof seconds);
    memcpy(ncalls, calls, sizeof calls);
}
