/* Include this (not numpy/arrayobject.h) in binding files that use the NumPy C API; the API table is
 * imported once, in tensor.c (PTL_NUMPY_IMPORT defined there). */
#ifndef PTL_NUMPY_API_H
#define PTL_NUMPY_API_H

#define PY_ARRAY_UNIQUE_SYMBOL ptl_ARRAY_API
#ifndef PTL_NUMPY_IMPORT
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>

/* NumPy type number of a ptl dtype (bfloat16 has none: -1), and back (-1 when unsupported). */
int ptl_dtype_to_npy(ptl_dtype dt);
int ptl_dtype_from_npy(int type_num);

#endif
