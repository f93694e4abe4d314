/* The safetensors reader: opens a file, validates its whole header against the file, reads tensors. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../file_info.h"
#include "json.h"
#include "safetensors.h"

static int parse_info(ptl_json *p, ptl_st_info *t)
{
    int have_dtype = 0, have_shape = 0, have_off = 0;
    if (ptl_json_expect(p, '{') < 0)
        return -1;
    if (ptl_json_peek(p) != '}') {
        for (;;) {
            char *key = NULL;
            if (ptl_json_string(p, &key, NULL) < 0)
                return -1;
            if (ptl_json_expect(p, ':') < 0) {
                free(key);
                return -1;
            }
            int rc;
            if (strcmp(key, "dtype") == 0) {
                char *dt = NULL;
                rc = ptl_json_string(p, &dt, NULL);
                if (rc == 0) {
                    if (ptl_st_dtype_size(dt) == 0)
                        rc = ptl_json_fail(p, "tensor '%.60s' has unsupported dtype '%.16s'", t->name, dt);
                    else
                        strcpy(t->dtype, dt);
                }
                free(dt);
                have_dtype = 1;
            } else if (strcmp(key, "shape") == 0) {
                uint64_t dims[PTL_MAX_DIMS];
                rc = ptl_json_uint_array(p, dims, PTL_MAX_DIMS, &t->ndim, "shape");
                for (int d = 0; rc == 0 && d < t->ndim; d++) {
                    if (dims[d] > (uint64_t)INT64_MAX)
                        rc = ptl_json_fail(p, "shape entry too large");
                    t->shape[d] = (int64_t)dims[d];
                }
                have_shape = 1;
            } else if (strcmp(key, "data_offsets") == 0) {
                uint64_t off[2];
                int k;
                rc = ptl_json_uint_array(p, off, 2, &k, "data_offsets");
                if (rc == 0 && k != 2)
                    rc = ptl_json_fail(p, "data_offsets must hold 2 integers");
                if (rc == 0) {
                    t->begin = off[0];
                    t->end = off[1];
                }
                have_off = 1;
            } else {
                rc = ptl_json_skip_value(p, 1);
            }
            free(key);
            if (rc < 0)
                return -1;
            int d = ptl_json_take(p);
            if (d == '}')
                break;
            if (d != ',')
                return ptl_json_fail(p, "expected ',' or '}'");
        }
    } else {
        p->s++;
    }
    if (!have_dtype || !have_shape || !have_off)
        return ptl_json_fail(p, "tensor '%.60s' lacks %s", t->name,
                             !have_dtype ? "a dtype" : !have_shape ? "a shape" : "data_offsets");
    return 0;
}

static int parse_metadata(ptl_json *p, ptl_st_file *f)
{
    size_t cap = 0;
    if (ptl_json_peek(p) == 'n')
        return ptl_json_skip_value(p, 1); /* null */
    if (ptl_json_expect(p, '{') < 0)
        return -1;
    if (ptl_json_peek(p) == '}') {
        p->s++;
        return 0;
    }
    for (;;) {
        if ((size_t)f->nmeta == cap) {
            cap = cap ? 2 * cap : 8;
            char **k = (char **)realloc(f->meta_keys, cap * sizeof *k);
            if (k)
                f->meta_keys = k;
            char **v = (char **)realloc(f->meta_values, cap * sizeof *v);
            if (v)
                f->meta_values = v;
            size_t *kl = (size_t *)realloc(f->meta_key_lens, cap * sizeof *kl);
            if (kl)
                f->meta_key_lens = kl;
            size_t *vl = (size_t *)realloc(f->meta_value_lens, cap * sizeof *vl);
            if (vl)
                f->meta_value_lens = vl;
            if (!k || !v || !kl || !vl) {
                p->failed = 1;
                return ptl_set_error(PTL_ERR_MEMORY, "load_safetensors: out of host memory");
            }
        }
        int64_t i = f->nmeta;
        if (ptl_json_string(p, &f->meta_keys[i], &f->meta_key_lens[i]) < 0)
            return -1;
        f->meta_values[i] = NULL;
        f->nmeta++;
        if (ptl_json_expect(p, ':') < 0)
            return -1;
        if (ptl_json_peek(p) != '"')
            return ptl_json_fail(p, "__metadata__ values must be strings");
        if (ptl_json_string(p, &f->meta_values[i], &f->meta_value_lens[i]) < 0)
            return -1;
        int d = ptl_json_take(p);
        if (d == '}')
            return 0;
        if (d != ',')
            return ptl_json_fail(p, "expected ',' or '}'");
    }
}

static int by_begin(const void *a, const void *b)
{
    const ptl_st_info *x = *(const ptl_st_info *const *)a, *y = *(const ptl_st_info *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int by_name(const void *a, const void *b)
{
    const ptl_st_info *x = *(const ptl_st_info *const *)a, *y = *(const ptl_st_info *const *)b;
    return strcmp(x->name, y->name);
}

static int read_at(int fd, const char *path, void *dst, size_t n, uint64_t offset)
{
    char *p = (char *)dst;
    while (n > 0) {
        size_t chunk = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
        ssize_t k = pread(fd, p, chunk, (off_t)offset);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return ptl_set_error(PTL_ERR_OS, "reading '%s': %s", path, strerror(errno));
        }
        if (k == 0)
            return ptl_set_error(PTL_ERR_VALUE, "'%s' is truncated (unexpected end of file)", path);
        p += k;
        n -= (size_t)k;
        offset += (uint64_t)k;
    }
    return 0;
}

void ptl_safetensors_close(ptl_st_file *f)
{
    if (f->fd >= 0)
        close(f->fd);
    f->fd = -1;
    for (int64_t i = 0; i < f->n; i++)
        free(f->tensors[i].name);
    for (int64_t i = 0; i < f->nmeta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->tensors);
    free(f->meta_keys);
    free(f->meta_values);
    free(f->meta_key_lens);
    free(f->meta_value_lens);
    free(f->path);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

int ptl_safetensors_open(const char *path, ptl_st_file *f)
{
    char *hdr = NULL;
    const ptl_st_info **sorted = NULL;
    size_t cap = 0;
    ptl_file_info st;
    memset(f, 0, sizeof *f);
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) {
        ptl_set_error(PTL_ERR_OS, "cannot open '%s': %s", path, strerror(errno));
        goto fail;
    }
    f->path = strdup(path);
    if (!f->path) {
        ptl_set_error(PTL_ERR_MEMORY, "load_safetensors: out of host memory");
        goto fail;
    }
    if (ptl_file_info_get(f->fd, NULL, &st) != 0) {
        ptl_set_error(PTL_ERR_OS, "cannot stat '%s': %s", path, strerror(errno));
        goto fail;
    }
    if (!st.is_regular) {
        ptl_set_error(PTL_ERR_OS, "'%s' is not a regular file", path);
        goto fail;
    }
    uint64_t size = st.size;
    if (size < 8) {
        ptl_set_error(PTL_ERR_VALUE, "'%s' is not a valid safetensors file: %llu bytes, shorter than the 8-byte "
                      "header length", path, (unsigned long long)size);
        goto fail;
    }
    uint8_t len8[8];
    PTL_CHECK(read_at(f->fd, path, len8, 8, 0));
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)len8[i] << (8 * i);
    if (hlen > PTL_ST_MAX_HEADER || hlen > size - 8) {
        ptl_set_error(PTL_ERR_VALUE, "'%s' is not a valid safetensors file: header length %llu %s (file of %llu "
                      "bytes)", path, (unsigned long long)hlen,
                      hlen > size - 8 ? "runs past the end of the file" : "exceeds the 100 MB limit",
                      (unsigned long long)size);
        goto fail;
    }
    hdr = (char *)malloc(hlen ? hlen : 1);
    if (!hdr) {
        ptl_set_error(PTL_ERR_MEMORY, "load_safetensors: out of host memory");
        goto fail;
    }
    PTL_CHECK(read_at(f->fd, path, hdr, hlen, 8));
    f->data_start = 8 + hlen;
    size_t bad_at;
    if (ptl_utf8_check(hdr, hlen, &bad_at) != 0) {
        ptl_set_error(PTL_ERR_VALUE, "'%s' is not a valid safetensors file: its header is not UTF-8 (byte %zu of the "
                      "header, value 0x%02x)", path, bad_at, (unsigned)(unsigned char)hdr[bad_at]);
        goto fail;
    }

    ptl_json p = {hdr, hdr + hlen, hdr, path, 0};
    if (ptl_json_peek(&p) != '{') {
        ptl_json_fail(&p, "header does not start with '{'");
        goto fail;
    }
    p.s++;
    if (ptl_json_peek(&p) == '}') {
        p.s++;
    } else {
        for (;;) {
            char *key = NULL;
            size_t key_len;
            if (ptl_json_string(&p, &key, &key_len) < 0 || ptl_json_expect(&p, ':') < 0) {
                free(key);
                goto fail;
            }
            if (strcmp(key, "__metadata__") == 0) {
                free(key);
                if (f->nmeta > 0 || parse_metadata(&p, f) < 0) {
                    ptl_json_fail(&p, "bad or repeated __metadata__");
                    goto fail;
                }
            } else {
                if ((size_t)f->n == cap) {
                    cap = cap ? 2 * cap : 64;
                    ptl_st_info *t = (ptl_st_info *)realloc(f->tensors, cap * sizeof *t);
                    if (!t) {
                        free(key);
                        ptl_set_error(PTL_ERR_MEMORY, "load_safetensors: out of host memory");
                        goto fail;
                    }
                    f->tensors = t;
                }
                ptl_st_info *t = &f->tensors[f->n++];
                memset(t, 0, sizeof *t);
                t->name = key;
                t->name_len = key_len;
                if (parse_info(&p, t) < 0)
                    goto fail;
            }
            int d = ptl_json_peek(&p);
            if (d != ',' && d != '}') {
                ptl_json_fail(&p, "expected ',' or '}'");
                goto fail;
            }
            p.s++;
            if (d == '}')
                break;
        }
    }
    ptl_json_skip_ws(&p);
    if (p.s != p.end) {
        ptl_json_fail(&p, "unexpected bytes after the header object");
        goto fail;
    }

    /* each tensor's range matches its shape, names are unique, and the ranges tile the data exactly */
    uint64_t data = size - f->data_start;
    sorted = (const ptl_st_info **)malloc((size_t)(f->n ? f->n : 1) * sizeof *sorted);
    if (!sorted) {
        ptl_set_error(PTL_ERR_MEMORY, "load_safetensors: out of host memory");
        goto fail;
    }
    for (int64_t i = 0; i < f->n; i++) {
        const ptl_st_info *t = &f->tensors[i];
        uint64_t bytes = ptl_st_dtype_size(t->dtype);
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] != 0 && bytes > UINT64_MAX / (uint64_t)t->shape[d]) {
                ptl_set_error(PTL_ERR_VALUE, "'%s' is not a valid safetensors file: tensor '%s' is too large", path,
                              t->name);
                goto fail;
            }
            bytes *= (uint64_t)t->shape[d];
        }
        if (t->end < t->begin || t->end - t->begin != bytes) {
            ptl_set_error(PTL_ERR_VALUE, "'%s' is not a valid safetensors file: tensor '%s' has data_offsets [%llu, "
                          "%llu] but its dtype and shape need %llu bytes", path, t->name,
                          (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)bytes);
            goto fail;
        }
        sorted[i] = t;
    }
    qsort(sorted, (size_t)f->n, sizeof *sorted, by_name);
    for (int64_t i = 1; i < f->n; i++)
        if (strcmp(sorted[i]->name, sorted[i - 1]->name) == 0) {
            ptl_set_error(PTL_ERR_VALUE, "'%s' is not a valid safetensors file: tensor '%s' appears twice", path,
                          sorted[i]->name);
            goto fail;
        }
    qsort(sorted, (size_t)f->n, sizeof *sorted, by_begin);
    uint64_t pos = 0;
    for (int64_t i = 0; i < f->n; i++) {
        if (sorted[i]->begin != pos) {
            ptl_set_error(PTL_ERR_VALUE, "'%s' is not a valid safetensors file: tensor '%s' starts at byte %llu of "
                          "the data, expected %llu (ranges must tile the data)", path, sorted[i]->name,
                          (unsigned long long)sorted[i]->begin, (unsigned long long)pos);
            goto fail;
        }
        pos = sorted[i]->end;
    }
    if (pos != data) {
        ptl_set_error(PTL_ERR_VALUE, "'%s' is %s: the header describes %llu data bytes but the file holds %llu", path,
                      pos > data ? "truncated" : "not a valid safetensors file", (unsigned long long)pos,
                      (unsigned long long)data);
        goto fail;
    }
    free(sorted);
    free(hdr);
    return 0;
fail:
    free(sorted);
    free(hdr);
    ptl_safetensors_close(f);
    return -1;
}

int ptl_safetensors_read(ptl_st_file *f, int64_t i, void *dst)
{
    const ptl_st_info *t = &f->tensors[i];
    return read_at(f->fd, f->path, dst, (size_t)(t->end - t->begin), f->data_start + t->begin);
}
