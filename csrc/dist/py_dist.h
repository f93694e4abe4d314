/* What the training step's binding (csrc/train) needs of a Python _DistGroup (py_dist.c): the C group, and
 * the CPU ranks' gradient all-reduce run the way every host wait runs (GIL released, Ctrl-C honoured). */
#ifndef PTL_DIST_PY_DIST_H
#define PTL_DIST_PY_DIST_H

#include "../py.h"
#include "dist.h"

/* The group of a ptl._C._DistGroup (a ProcessGroup's `_g`), or NULL with TypeError / RuntimeError (closed). */
ptl_dist_group *ptl_py_dist_group(PyObject *obj);
/* The group of a _DistGroup for a caller that waits on it with the GIL released (the training step): marks
 * it busy until ptl_py_dist_release, so that another thread's call is refused meanwhile. NULL with
 * TypeError / RuntimeError (closed, or busy). */
ptl_dist_group *ptl_py_dist_acquire(PyObject *obj);
void ptl_py_dist_release(PyObject *obj);
/* Raises the pending ptl error, a failed collective (PTL_ERR_RUNTIME) as ptl.DistributedError; NULL. */
PyObject *ptl_py_dist_raise(PyObject *module);
/* The host all-reduce (sum in rank order) of count float32/float64 elements at buf, with the GIL released;
 * 0, or -1 with a Python exception (DistributedError naming the rank, KeyboardInterrupt). */
int ptl_py_dist_all_reduce(PyObject *group_obj, void *buf, int64_t count, ptl_dtype dt);

#endif
