/* Argument checks shared by the layer kernels: the CPU's, and the pixel geometry also CUDA's. */
#ifndef PTL_NN_CPU_CHECK_H
#define PTL_NN_CPU_CHECK_H

#include "../ptl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* float32 or float64, and positive NHWC sizes; -1 after ptl_set_error naming `fn` otherwise. */
int ptl_nn_check_nhwc(const char *fn, ptl_dtype dt, int n, int h, int w, int c);
/* Positive NHWC sizes, and the elements between the pixels of the input (ldx) and of the output (ldy), each
 * >= c; any dtype. */
int ptl_nn_check_pixels(const char *fn, int n, int h, int w, int c, int ldx, int ldy);
/* Both. */
int ptl_nn_check_nhwc_strided(const char *fn, ptl_dtype dt, int n, int h, int w, int c, int ldx, int ldy);

#ifdef __cplusplus
}
#endif

#endif
