/* What the training step's binding (csrc/train) needs of a Python _NcclComm (py_nccl.c). */
#ifndef PTL_CUDA_PY_NCCL_H
#define PTL_CUDA_PY_NCCL_H

#include "../py.h"
#include "nccl_comm.h"

/* The communicator of a ptl._C._NcclComm, or NULL with TypeError / RuntimeError (closed). */
ptl_nccl_comm *ptl_py_nccl_comm(PyObject *obj);

#endif
