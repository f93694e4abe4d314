/* The safetensors writer: checks the entries, builds the header, writes the file atomically. */
#include <stdlib.h>
#include <string.h>

#include "atomic_file.h"
#include "json.h"
#include "safetensors.h"

static int by_size_then_name(const void *a, const void *b)
{
    const ptl_st_entry *x = *(const ptl_st_entry *const *)a, *y = *(const ptl_st_entry *const *)b;
    size_t sx = ptl_st_dtype_size(x->dtype), sy = ptl_st_dtype_size(y->dtype);
    if (sx != sy)
        return sx > sy ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int by_entry_name(const void *a, const void *b)
{
    return strcmp((*(const ptl_st_entry *const *)a)->name, (*(const ptl_st_entry *const *)b)->name);
}

static int check_entry(const char *path, const ptl_st_entry *e)
{
    size_t item = ptl_st_dtype_size(e->dtype);
    if (item == 0)
        return ptl_set_error(PTL_ERR_VALUE, "save_safetensors '%s': tensor '%s' has unknown dtype '%s'", path,
                             e->name, e->dtype);
    if (strcmp(e->name, "__metadata__") == 0)
        return ptl_set_error(PTL_ERR_VALUE, "save_safetensors '%s': '__metadata__' cannot name a tensor", path);
    if (e->ndim < 0 || e->ndim > PTL_MAX_DIMS)
        return ptl_set_error(PTL_ERR_VALUE, "save_safetensors '%s': tensor '%s' has %d dimensions (0 to %d)", path,
                             e->name, e->ndim, PTL_MAX_DIMS);
    /* the byte count in uint64 without wrapping, so the header never describes a tensor the reader
     * rejects as too large */
    uint64_t bytes = item;
    for (int d = 0; d < e->ndim; d++) {
        if (e->shape[d] < 0 || (e->shape[d] != 0 && bytes > UINT64_MAX / (uint64_t)e->shape[d]))
            return ptl_set_error(PTL_ERR_VALUE,
                                 "save_safetensors '%s': tensor '%s' has a negative or too large shape", path,
                                 e->name);
        bytes *= (uint64_t)e->shape[d];
    }
    if (bytes != e->nbytes)
        return ptl_set_error(PTL_ERR_VALUE, "save_safetensors '%s': tensor '%s' has %zu bytes, not its shape's %llu",
                             path, e->name, e->nbytes, (unsigned long long)bytes);
    return 0;
}

/* The header text for entries in file order, padded with spaces to a multiple of 8. */
static void build_header(ptl_strbuf *hdr, const ptl_st_entry *const *order, int64_t n,
                         const char *const *meta_keys, const char *const *meta_values, int64_t nmeta)
{
    ptl_sb_str(hdr, "{");
    if (nmeta > 0) {
        ptl_sb_str(hdr, "\"__metadata__\":{");
        for (int64_t i = 0; i < nmeta; i++) {
            if (i)
                ptl_sb_str(hdr, ",");
            ptl_sb_json_string(hdr, meta_keys[i]);
            ptl_sb_str(hdr, ":");
            ptl_sb_json_string(hdr, meta_values[i]);
        }
        ptl_sb_str(hdr, "}");
    }
    uint64_t offset = 0;
    for (int64_t i = 0; i < n; i++) {
        const ptl_st_entry *e = order[i];
        if (i || nmeta > 0)
            ptl_sb_str(hdr, ",");
        ptl_sb_json_string(hdr, e->name);
        ptl_sb_str(hdr, ":{\"dtype\":");
        ptl_sb_json_string(hdr, e->dtype);
        ptl_sb_str(hdr, ",\"shape\":[");
        for (int d = 0; d < e->ndim; d++)
            ptl_sb_fmt(hdr, d ? ",%lld" : "%lld", (long long)e->shape[d]);
        ptl_sb_fmt(hdr, "],\"data_offsets\":[%llu,", (unsigned long long)offset);
        offset += e->nbytes;
        ptl_sb_fmt(hdr, "%llu]}", (unsigned long long)offset);
    }
    ptl_sb_str(hdr, "}");
    while (hdr->len % 8)
        ptl_sb_str(hdr, " ");
}

int ptl_safetensors_write(const char *path, const ptl_st_entry *entries, int64_t n, const char *const *meta_keys,
                          const char *const *meta_values, int64_t nmeta)
{
    const ptl_st_entry **order = NULL;
    ptl_strbuf hdr = {0};
    ptl_atomic_file out = {.fd = -1};
    int opened = 0;

    order = (const ptl_st_entry **)malloc((size_t)(n ? n : 1) * sizeof *order);
    if (!order) {
        ptl_set_error(PTL_ERR_MEMORY, "save_safetensors: out of host memory");
        goto fail;
    }
    for (int64_t i = 0; i < n; i++) {
        PTL_CHECK(check_entry(path, &entries[i]));
        order[i] = &entries[i];
    }
    qsort(order, (size_t)n, sizeof *order, by_entry_name);
    for (int64_t i = 1; i < n; i++)
        if (strcmp(order[i]->name, order[i - 1]->name) == 0) {
            ptl_set_error(PTL_ERR_VALUE, "save_safetensors '%s': duplicate tensor name '%s'", path, order[i]->name);
            goto fail;
        }
    qsort(order, (size_t)n, sizeof *order, by_size_then_name);
    build_header(&hdr, order, n, meta_keys, meta_values, nmeta);
    if (hdr.oom) {
        ptl_set_error(PTL_ERR_MEMORY, "save_safetensors: out of host memory");
        goto fail;
    }
    if (hdr.len > PTL_ST_MAX_HEADER) {
        ptl_set_error(PTL_ERR_VALUE, "save_safetensors '%s': header of %zu bytes exceeds the %u-byte limit", path,
                      hdr.len, PTL_ST_MAX_HEADER);
        goto fail;
    }

    PTL_CHECK(ptl_atomic_open(&out, path));
    opened = 1;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)hdr.len >> (8 * i));
    PTL_CHECK(ptl_atomic_write(&out, len8, 8));
    PTL_CHECK(ptl_atomic_write(&out, hdr.s, hdr.len));
    for (int64_t i = 0; i < n; i++)
        PTL_CHECK(ptl_atomic_write(&out, order[i]->data, order[i]->nbytes));
    opened = 0; /* commit releases the file either way */
    PTL_CHECK(ptl_atomic_commit(&out));
    free(hdr.s);
    free(order);
    return 0;
fail:
    if (opened)
        ptl_atomic_abort(&out);
    free(hdr.s);
    free(order);
    return -1;
}
