/* Argument checks shared by the CPU layer kernels. */
#ifndef PTL_NN_CPU_CHECK_H
#define PTL_NN_CPU_CHECK_H

#include "../ptl.h"

/* float32 or float64, and positive NHWC sizes; -1 after ptl_set_error naming `fn` otherwise. */
int ptl_nn_check_nhwc(const char *fn, ptl_dtype dt, int n, int h, int w, int c);
/* The same, with the elements between the pixels of the input (ldx) and of the output (ldy), each >= c. */
int ptl_nn_check_nhwc_strided(const char *fn, ptl_dtype dt, int n, int h, int w, int c, int ldx, int ldy);

#endif
