/* The safetensors dtype names and their item sizes; see safetensors.h. */
#include <string.h>

#include "safetensors.h"

static const struct {
    const char *name;
    size_t size;
} dtypes[] = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2},
              {"I8", 1},  {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1},    {"BOOL", 1}};

size_t ptl_st_dtype_size(const char *dtype)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (strcmp(dtype, dtypes[i].name) == 0)
            return dtypes[i].size;
    return 0;
}
