/* The data area's binding files (py_data.c registers both). */
#ifndef PTL_DATA_PY_DATA_H
#define PTL_DATA_PY_DATA_H

#include "../py.h"

int ptl_register_data_pieces(PyObject *module);

#endif
