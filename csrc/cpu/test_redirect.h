/* Test-only bridge until the executor's backend table (issue 12) takes the fast CPU backend: while
 * installed, the reference entry points of csrc/nn that consult ptl_cpu_test_redirect_ops (convolution
 * forward and gradients, BatchNorm, attention, max-pool, add, accumulate and channel copies) send their
 * float32 calls here, to the fast
 * kernels, so that the unchanged CPU network can be run, compared and timed with them. NULL, the
 * default, leaves the reference kernels in place. Not thread-safe: one network at a time. */
#ifndef PTL_CPU_TEST_REDIRECT_H
#define PTL_CPU_TEST_REDIRECT_H

#include "../nn/activation.h"
#include "../nn/conv2d.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The reference signatures, float32, without the dtype; NULL entries keep the reference. */
typedef struct {
    int (*conv2d_forward)(const ptl_conv2d_desc *d, const float *x, const float *wt, const float *bias, float *y);
    int (*conv2d_backward_input)(const ptl_conv2d_desc *d, const float *dy, const float *wt, float *dx);
    int (*conv2d_backward_weight)(const ptl_conv2d_desc *d, const float *x, const float *dy, float *dwt);
    int (*batchnorm_forward)(int64_t m, int c, const float *x, const float *gamma, const float *beta,
                             float *running_mean, float *running_var, int training, ptl_act act, float *save_mean,
                             float *save_invstd, float *y);
    int (*batchnorm_backward)(int64_t m, int c, const float *x, const float *dy, const float *gamma,
                              const float *beta, const float *save_mean, const float *save_invstd, int training,
                              ptl_act act, float *dx, float *dgamma, float *dbeta);
    int (*attention_forward)(int b, int n, int heads, int kd, int hd, const float *qkv, float *attn, float *o,
                             float *v);
    int (*attention_backward)(int b, int n, int heads, int kd, int hd, const float *qkv, const float *attn,
                              const float *d_o, const float *dv, float *dqkv);
    int (*add)(int64_t n, const float *a, const float *b, float *y);
    int (*accumulate)(int64_t n, const float *x, float *y);
    int (*channel_copy)(int64_t m, int c, const float *src, int src_c, int src_off, float *dst, int dst_c,
                        int dst_off, int accumulate);
    int (*maxpool5_forward)(int n, int h, int w, int c, const float *x, float *y);
    int (*maxpool5_backward)(int n, int h, int w, int c, const float *x, const float *dy, float *dx, int accumulate);
} ptl_cpu_redirect;

extern const ptl_cpu_redirect *ptl_cpu_test_redirect_ops;

/* Whether the reference entry point `fn` (a member above) sends this dtype's call here. */
#define PTL_CPU_REDIRECTED(dt, fn)                                                                           \
    ((dt) == PTL_FLOAT32 && ptl_cpu_test_redirect_ops && ptl_cpu_test_redirect_ops->fn)

enum {
    PTL_CPU_REDIRECT_CONV = 1,
    PTL_CPU_REDIRECT_BATCHNORM = 2,
    PTL_CPU_REDIRECT_ATTENTION = 4,
    PTL_CPU_REDIRECT_ELEMENTWISE = 8, /* add, accumulate, channel copies */
    PTL_CPU_REDIRECT_MAXPOOL = 16,
    PTL_CPU_REDIRECT_ALL = 31
};

/* Installs the redirect for the kernels named by `kinds` (PTL_CPU_REDIRECT_* bits; the others keep the
 * reference); 0 removes it and frees its plans. Fails without oneDNN. */
int ptl_cpu_test_redirect(int kinds);

/* Wall seconds spent in, and calls of, each redirected entry since the redirect was installed, in the
 * order of ptl_cpu_redirect's members (for benchmarks). */
#define PTL_CPU_REDIRECT_ENTRIES 12
void ptl_cpu_test_redirect_stats(double secs[PTL_CPU_REDIRECT_ENTRIES], int64_t calls[PTL_CPU_REDIRECT_ENTRIES]);

#ifdef __cplusplus
}
#endif

#endif
