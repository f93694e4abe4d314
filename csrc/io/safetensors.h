/* .safetensors files: 8-byte little-endian header length N, N bytes of JSON
 *   {"__metadata__": {str: str}, name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...}
 * padded with spaces to a multiple of 8, then the tensors' raw little-endian bytes, back to back.
 * safetensors_dtypes.c: the dtype table; safetensors_write.c: the writer (atomic, atomic_file.h);
 * safetensors_read.c: the reader, which checks the whole header (UTF-8, JSON, dtypes, shapes against
 * byte ranges, ranges tiling the data exactly, file length) before any data is read. json.c: the
 * header's JSON. Errors name the path. Little-endian hosts only (x86-64, aarch64). */
#ifndef PTL_IO_SAFETENSORS_H
#define PTL_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "../ptl.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PTL_ST_MAX_HEADER (100u * 1000u * 1000u) /* the reference implementation's limit */

/* Item size of a safetensors dtype name (F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16 U8 BOOL), or 0. */
size_t ptl_st_dtype_size(const char *dtype);

typedef struct {
    const char *name; /* UTF-8 */
    const char *dtype;
    int ndim;
    int64_t shape[PTL_MAX_DIMS];
    const void *data;
    size_t nbytes; /* must equal prod(shape) * itemsize */
} ptl_st_entry;

/* Tensors are stored by item size (largest first), then name, so every tensor is aligned to its item
 * size, as the reference writer does. Written atomically (atomic_file.h). */
int ptl_safetensors_write(const char *path, const ptl_st_entry *entries, int64_t n, const char *const *meta_keys,
                          const char *const *meta_values, int64_t nmeta);

typedef struct {
    char *name;
    size_t name_len;
    char dtype[8];
    int ndim;
    int64_t shape[PTL_MAX_DIMS];
    uint64_t begin, end; /* byte range in the data section */
} ptl_st_info;

typedef struct {
    char *path;
    int fd;
    uint64_t data_start; /* 8 + N */
    int64_t n;
    ptl_st_info *tensors; /* in header order */
    int64_t nmeta;
    char **meta_keys, **meta_values;
    size_t *meta_key_lens, *meta_value_lens;
} ptl_st_file;

/* Opens and validates; on failure everything is released. */
int ptl_safetensors_open(const char *path, ptl_st_file *f);
/* Reads tensor i's bytes (tensors[i].end - tensors[i].begin of them) into dst. */
int ptl_safetensors_read(ptl_st_file *f, int64_t i, void *dst);
void ptl_safetensors_close(ptl_st_file *f);

#ifdef __cplusplus
}
#endif

#endif
