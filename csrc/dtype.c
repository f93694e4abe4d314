#include <string.h>

#include "ptl.h"

static const struct {
    const char *name;
    size_t size;
} dtypes[PTL_NUM_DTYPES] = {
    [PTL_FLOAT32] = {"float32", 4}, [PTL_FLOAT64] = {"float64", 8}, [PTL_FLOAT16] = {"float16", 2},
    [PTL_BFLOAT16] = {"bfloat16", 2}, [PTL_INT32] = {"int32", 4},   [PTL_INT64] = {"int64", 8},
    [PTL_UINT8] = {"uint8", 1},
};

size_t ptl_dtype_size(ptl_dtype dt) { return (unsigned)dt < PTL_NUM_DTYPES ? dtypes[dt].size : 0; }

const char *ptl_dtype_name(ptl_dtype dt) { return (unsigned)dt < PTL_NUM_DTYPES ? dtypes[dt].name : "?"; }

int ptl_dtype_from_name(const char *name)
{
    for (int i = 0; i < PTL_NUM_DTYPES; i++)
        if (strcmp(name, dtypes[i].name) == 0)
            return i;
    return -1;
}
