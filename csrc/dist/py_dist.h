/* What the training step's binding (csrc/train) needs of a Python _DistGroup (py_dist.c): the C group, and
 * the CPU ranks' gradient all-reduce run the way every host wait runs (GIL released, Ctrl-C honoured). */
#ifndef PTL_DIST_PY_DIST_H
#define PTL_DIST_PY_DIST_H

#include "../py.h"
#include "dist.h"

/* The group of a ptl._C._DistGroup (a ProcessGroup's `_g`), or NULL with TypeError / RuntimeError (closed). */
ptl_dist_group *ptl_py_dist_group(PyObject *obj);
/* The host all-reduce (sum in rank order) of count float32/float64 elements at buf, with the GIL released;
 * 0, or -1 with a Python exception (DistributedError naming the rank, KeyboardInterrupt). */
int ptl_py_dist_all_reduce(PyObject *group_obj, void *buf, int64_t count, ptl_dtype dt);

#endif
