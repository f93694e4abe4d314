/* safetensors writer and reader; see safetensors.h. Little-endian hosts only (x86-64, aarch64). */
#define _GNU_SOURCE /* statx */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

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

/* ---------------------------------------------------------------- growable text buffer */

typedef struct {
    char *s;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->len + n + 1 > cap)
            cap *= 2;
        char *p = (char *)realloc(b->s, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_fmt(sbuf *b, const char *fmt, ...)
{
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    sb_put(b, tmp, (size_t)n);
}

static void sb_json_string(sbuf *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            char e[2] = {'\\', (char)*p};
            sb_put(b, e, 2);
        } else if (*p < 0x20) {
            sb_fmt(b, "\\u%04x", *p);
        } else {
            sb_put(b, (const char *)p, 1);
        }
    }
    sb_put(b, "\"", 1);
}

/* ---------------------------------------------------------------- writer */

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

typedef struct {
    int fd;
    const char *path;
    int64_t written;
    const ptl_st_fault *fault;
} writer;

static int write_all(writer *w, const void *data, size_t n)
{
    const char *p = (const char *)data;
    while (n > 0) {
        size_t chunk = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
        int64_t limit = w->fault ? w->fault->after_bytes : -1;
        if (limit >= 0 && w->written + (int64_t)chunk > limit) {
            chunk = (size_t)(limit - w->written);
            if (chunk == 0) {
                if (w->fault->kill)
                    raise(SIGKILL);
                return ptl_set_error(PTL_ERR_OS, "writing '%s': injected failure after %lld bytes", w->path,
                                     (long long)w->written);
            }
        }
        ssize_t k = write(w->fd, p, chunk);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return ptl_set_error(PTL_ERR_OS, "writing '%s': %s", w->path, strerror(errno));
        }
        p += k;
        n -= (size_t)k;
        w->written += k;
    }
    return 0;
}

static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return strdup(".");
    if (slash == path)
        return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

int ptl_safetensors_write(const char *path, const ptl_st_entry *entries, int64_t n, const char *const *meta_keys,
                          const char *const *meta_values, int64_t nmeta, const ptl_st_fault *fault)
{
    const ptl_st_entry **order = NULL;
    sbuf hdr = {0};
    char *tmp = NULL, *dir = NULL;
    int fd = -1, dfd = -1;

    order = (const ptl_st_entry **)malloc((size_t)(n ? n : 1) * sizeof *order);
    if (!order) {
        ptl_set_error(PTL_ERR_MEMORY, "save_safetensors: out of host memory");
        goto fail;
    }
    for (int64_t i = 0; i < n; i++) {
        const ptl_st_entry *e = &entries[i];
        size_t item = ptl_st_dtype_size(e->dtype);
        if (item == 0) {
            ptl_set_error(PTL_ERR_VALUE, "save_safetensors '%s': tensor '%s' has unknown dtype '%s'", path, e->name,
                          e->dtype);
            goto fail;
        }
        if (strcmp(e->name, "__metadata__") == 0) {
            ptl_set_error(PTL_ERR_VALUE, "save_safetensors '%s': '__metadata__' cannot name a tensor", path);
            goto fail;
        }
        if (e->ndim < 0 || e->ndim > PTL_MAX_DIMS) {
            ptl_set_error(PTL_ERR_VALUE, "save_safetensors '%s': tensor '%s' has %d dimensions (0 to %d)", path,
                          e->name, e->ndim, PTL_MAX_DIMS);
            goto fail;
        }
        /* the byte count in uint64 without wrapping, so the header never describes a tensor the reader
         * rejects as too large */
        uint64_t bytes = item;
        for (int d = 0; d < e->ndim; d++) {
            if (e->shape[d] < 0 || (e->shape[d] != 0 && bytes > UINT64_MAX / (uint64_t)e->shape[d])) {
                ptl_set_error(PTL_ERR_VALUE, "save_safetensors '%s': tensor '%s' has a negative or too large shape",
                              path, e->name);
                goto fail;
            }
            bytes *= (uint64_t)e->shape[d];
        }
        if (bytes != e->nbytes) {
            ptl_set_error(PTL_ERR_VALUE, "save_safetensors '%s': tensor '%s' has %zu bytes, not its shape's %llu",
                          path, e->name, e->nbytes, (unsigned long long)bytes);
            goto fail;
        }
        order[i] = e;
    }
    qsort(order, (size_t)n, sizeof *order, by_entry_name);
    for (int64_t i = 1; i < n; i++)
        if (strcmp(order[i]->name, order[i - 1]->name) == 0) {
            ptl_set_error(PTL_ERR_VALUE, "save_safetensors '%s': duplicate tensor name '%s'", path, order[i]->name);
            goto fail;
        }
    qsort(order, (size_t)n, sizeof *order, by_size_then_name);

    sb_str(&hdr, "{");
    if (nmeta > 0) {
        sb_str(&hdr, "\"__metadata__\":{");
        for (int64_t i = 0; i < nmeta; i++) {
            if (i)
                sb_str(&hdr, ",");
            sb_json_string(&hdr, meta_keys[i]);
            sb_str(&hdr, ":");
            sb_json_string(&hdr, meta_values[i]);
        }
        sb_str(&hdr, "}");
    }
    uint64_t offset = 0;
    for (int64_t i = 0; i < n; i++) {
        const ptl_st_entry *e = order[i];
        if (i || nmeta > 0)
            sb_str(&hdr, ",");
        sb_json_string(&hdr, e->name);
        sb_str(&hdr, ":{\"dtype\":");
        sb_json_string(&hdr, e->dtype);
        sb_str(&hdr, ",\"shape\":[");
        for (int d = 0; d < e->ndim; d++)
            sb_fmt(&hdr, d ? ",%lld" : "%lld", (long long)e->shape[d]);
        sb_fmt(&hdr, "],\"data_offsets\":[%llu,", (unsigned long long)offset);
        offset += e->nbytes;
        sb_fmt(&hdr, "%llu]}", (unsigned long long)offset);
    }
    sb_str(&hdr, "}");
    while (hdr.len % 8)
        sb_str(&hdr, " ");
    if (hdr.oom) {
        ptl_set_error(PTL_ERR_MEMORY, "save_safetensors: out of host memory");
        goto fail;
    }
    if (hdr.len > PTL_ST_MAX_HEADER) {
        ptl_set_error(PTL_ERR_VALUE, "save_safetensors '%s': header of %zu bytes exceeds the %u-byte limit", path,
                      hdr.len, PTL_ST_MAX_HEADER);
        goto fail;
    }

    size_t tlen = strlen(path) + 64;
    tmp = (char *)malloc(tlen);
    dir = dir_of(path);
    if (!tmp || !dir) {
        ptl_set_error(PTL_ERR_MEMORY, "save_safetensors: out of host memory");
        goto fail;
    }
    /* process and thread ids keep concurrent writers apart; the attempt number steps over files left
     * by a crashed process that had the same ids */
    for (int attempt = 0; fd < 0; attempt++) {
        snprintf(tmp, tlen, "%s.tmp.%ld.%ld.%d", path, (long)getpid(), (long)syscall(SYS_gettid), attempt);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && (errno != EEXIST || attempt > 100)) {
            ptl_set_error(PTL_ERR_OS, "save_safetensors: cannot create '%s': %s", tmp, strerror(errno));
            free(tmp);
            tmp = NULL; /* nothing to remove */
            goto fail;
        }
    }
    {
        writer w = {fd, path, 0, fault};
        uint8_t len8[8];
        for (int i = 0; i < 8; i++)
            len8[i] = (uint8_t)((uint64_t)hdr.len >> (8 * i));
        PTL_CHECK(write_all(&w, len8, 8));
        PTL_CHECK(write_all(&w, hdr.s, hdr.len));
        for (int64_t i = 0; i < n; i++)
            PTL_CHECK(write_all(&w, order[i]->data, order[i]->nbytes));
    }
    if (fsync(fd) != 0) {
        ptl_set_error(PTL_ERR_OS, "save_safetensors: fsync of '%s' failed: %s", tmp, strerror(errno));
        goto fail;
    }
    int rc = close(fd);
    fd = -1;
    if (rc != 0) {
        ptl_set_error(PTL_ERR_OS, "save_safetensors: closing '%s' failed: %s", tmp, strerror(errno));
        goto fail;
    }
    if (rename(tmp, path) != 0) {
        ptl_set_error(PTL_ERR_OS, "save_safetensors: cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
        goto fail;
    }
    free(tmp);
    tmp = NULL;
    /* make the rename itself durable; folders that cannot be fsynced are left as they are */
    dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    free(dir);
    free(hdr.s);
    free(order);
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    if (tmp)
        unlink(tmp);
    free(tmp);
    free(dir);
    free(hdr.s);
    free(order);
    return -1;
}

/* ---------------------------------------------------------------- JSON header parser */

typedef struct {
    const char *s, *end, *start;
    const char *path;
    int failed;
} parser;

static int perr(parser *p, const char *what)
{
    if (!p->failed)
        ptl_set_error(PTL_ERR_VALUE, "'%s' is not a valid safetensors file: %s at header byte %ld", p->path, what,
                      (long)(p->s - p->start));
    p->failed = 1;
    return -1;
}

static void skip_ws(parser *p)
{
    while (p->s < p->end && (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r'))
        p->s++;
}

static int expect(parser *p, char c)
{
    skip_ws(p);
    if (p->s >= p->end || *p->s != c) {
        char msg[32];
        snprintf(msg, sizeof msg, "expected '%c'", c);
        return perr(p, msg);
    }
    p->s++;
    return 0;
}

static int peek(parser *p)
{
    skip_ws(p);
    return p->s < p->end ? (unsigned char)*p->s : -1;
}

/* The next non-space character, consumed; -1 (and nothing consumed) at the end of the header. */
static int take(parser *p)
{
    int c = peek(p);
    if (c >= 0)
        p->s++;
    return c;
}

static int hex4(parser *p, unsigned *out)
{
    if (p->end - p->s < 4)
        return perr(p, "truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = *p->s++;
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return perr(p, "bad \\u escape");
    }
    *out = v;
    return 0;
}

/* A JSON string as malloc'd UTF-8 (NUL-terminated; embedded NULs rejected); out may be NULL to skip. */
static int parse_string(parser *p, char **out, size_t *out_len)
{
    sbuf b = {0};
    if (expect(p, '"') < 0)
        return -1;
    for (;;) {
        if (p->s >= p->end) {
            perr(p, "unterminated string");
            goto fail;
        }
        unsigned char c = (unsigned char)*p->s++;
        if (c == '"')
            break;
        if (c < 0x20) {
            perr(p, "control character in string");
            goto fail;
        }
        if (c != '\\') {
            sb_put(&b, (const char *)&c, 1);
            continue;
        }
        if (p->s >= p->end) {
            perr(p, "unterminated string");
            goto fail;
        }
        char e = *p->s++, ch;
        unsigned cp;
        switch (e) {
        case '"': ch = '"'; break;
        case '\\': ch = '\\'; break;
        case '/': ch = '/'; break;
        case 'b': ch = '\b'; break;
        case 'f': ch = '\f'; break;
        case 'n': ch = '\n'; break;
        case 'r': ch = '\r'; break;
        case 't': ch = '\t'; break;
        case 'u':
            if (hex4(p, &cp) < 0)
                goto fail;
            if (cp >= 0xD800 && cp < 0xDC00) {
                unsigned lo;
                if (p->end - p->s < 2 || p->s[0] != '\\' || p->s[1] != 'u') {
                    perr(p, "unpaired surrogate");
                    goto fail;
                }
                p->s += 2;
                if (hex4(p, &lo) < 0)
                    goto fail;
                if (lo < 0xDC00 || lo > 0xDFFF) {
                    perr(p, "unpaired surrogate");
                    goto fail;
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp < 0xE000) {
                perr(p, "unpaired surrogate");
                goto fail;
            }
            if (cp == 0) {
                perr(p, "NUL character in string");
                goto fail;
            }
            {
                char u[4];
                size_t k;
                if (cp < 0x80) {
                    u[0] = (char)cp;
                    k = 1;
                } else if (cp < 0x800) {
                    u[0] = (char)(0xC0 | (cp >> 6));
                    u[1] = (char)(0x80 | (cp & 0x3F));
                    k = 2;
                } else if (cp < 0x10000) {
                    u[0] = (char)(0xE0 | (cp >> 12));
                    u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
                    u[2] = (char)(0x80 | (cp & 0x3F));
                    k = 3;
                } else {
                    u[0] = (char)(0xF0 | (cp >> 18));
                    u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
                    u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
                    u[3] = (char)(0x80 | (cp & 0x3F));
                    k = 4;
                }
                sb_put(&b, u, k);
            }
            continue;
        default:
            perr(p, "bad escape in string");
            goto fail;
        }
        sb_put(&b, &ch, 1);
    }
    if (b.oom) {
        ptl_set_error(PTL_ERR_MEMORY, "load_safetensors: out of host memory");
        p->failed = 1;
        goto fail;
    }
    if (!b.s) {
        b.s = strdup("");
        if (!b.s) {
            ptl_set_error(PTL_ERR_MEMORY, "load_safetensors: out of host memory");
            p->failed = 1;
            goto fail;
        }
    }
    if (out_len)
        *out_len = b.len;
    if (out)
        *out = b.s;
    else
        free(b.s);
    return 0;
fail:
    free(b.s);
    return -1;
}

static int parse_uint(parser *p, uint64_t *out)
{
    skip_ws(p);
    if (p->s >= p->end || *p->s < '0' || *p->s > '9')
        return perr(p, "expected a non-negative integer");
    uint64_t v = 0;
    while (p->s < p->end && *p->s >= '0' && *p->s <= '9') {
        unsigned d = (unsigned)(*p->s++ - '0');
        if (v > (UINT64_MAX - d) / 10)
            return perr(p, "integer too large");
        v = v * 10 + d;
    }
    if (p->s < p->end && (*p->s == '.' || *p->s == 'e' || *p->s == 'E'))
        return perr(p, "expected an integer");
    *out = v;
    return 0;
}

/* Skips any JSON value (for keys this reader does not use). */
static int skip_value(parser *p, int depth)
{
    int c = peek(p);
    if (depth > 64)
        return perr(p, "nesting too deep");
    if (c == '"')
        return parse_string(p, NULL, NULL);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        p->s++;
        if (peek(p) == close) {
            p->s++;
            return 0;
        }
        for (;;) {
            if (c == '{') {
                if (parse_string(p, NULL, NULL) < 0 || expect(p, ':') < 0)
                    return -1;
            }
            if (skip_value(p, depth + 1) < 0)
                return -1;
            int d = take(p);
            if (d == close)
                return 0;
            if (d != ',')
                return perr(p, "expected ',' or a closing bracket");
        }
    }
    const char *lits[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t k = strlen(lits[i]);
        if ((size_t)(p->end - p->s) >= k && memcmp(p->s, lits[i], k) == 0) {
            p->s += k;
            return 0;
        }
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        while (p->s < p->end && strchr("+-0123456789.eE", *p->s))
            p->s++;
        return 0;
    }
    return perr(p, "expected a value");
}

static int parse_uint_array(parser *p, uint64_t *vals, int max, int *count, const char *what)
{
    *count = 0;
    if (expect(p, '[') < 0)
        return -1;
    if (peek(p) == ']') {
        p->s++;
        return 0;
    }
    for (;;) {
        if (*count == max) {
            char msg[64];
            snprintf(msg, sizeof msg, "%s has more than %d entries", what, max);
            return perr(p, msg);
        }
        if (parse_uint(p, &vals[(*count)++]) < 0)
            return -1;
        int d = take(p);
        if (d == ']')
            return 0;
        if (d != ',')
            return perr(p, "expected ',' or ']'");
    }
}

static int parse_info(parser *p, ptl_st_info *t)
{
    int have_dtype = 0, have_shape = 0, have_off = 0;
    if (expect(p, '{') < 0)
        return -1;
    if (peek(p) != '}') {
        for (;;) {
            char *key = NULL;
            if (parse_string(p, &key, NULL) < 0)
                return -1;
            if (expect(p, ':') < 0) {
                free(key);
                return -1;
            }
            int rc;
            if (strcmp(key, "dtype") == 0) {
                char *dt = NULL;
                rc = parse_string(p, &dt, NULL);
                if (rc == 0) {
                    if (ptl_st_dtype_size(dt) == 0) {
                        char msg[96];
                        snprintf(msg, sizeof msg, "tensor '%.40s' has unsupported dtype '%.16s'", t->name, dt);
                        rc = perr(p, msg);
                    } else {
                        strcpy(t->dtype, dt);
                    }
                }
                free(dt);
                have_dtype = 1;
            } else if (strcmp(key, "shape") == 0) {
                uint64_t dims[PTL_MAX_DIMS];
                rc = parse_uint_array(p, dims, PTL_MAX_DIMS, &t->ndim, "shape");
                for (int d = 0; rc == 0 && d < t->ndim; d++) {
                    if (dims[d] > (uint64_t)INT64_MAX)
                        rc = perr(p, "shape entry too large");
                    t->shape[d] = (int64_t)dims[d];
                }
                have_shape = 1;
            } else if (strcmp(key, "data_offsets") == 0) {
                uint64_t off[2];
                int k;
                rc = parse_uint_array(p, off, 2, &k, "data_offsets");
                if (rc == 0 && k != 2)
                    rc = perr(p, "data_offsets must hold 2 integers");
                if (rc == 0) {
                    t->begin = off[0];
                    t->end = off[1];
                }
                have_off = 1;
            } else {
                rc = skip_value(p, 1);
            }
            free(key);
            if (rc < 0)
                return -1;
            int d = take(p);
            if (d == '}')
                break;
            if (d != ',')
                return perr(p, "expected ',' or '}'");
        }
    } else {
        p->s++;
    }
    if (!have_dtype || !have_shape || !have_off) {
        char msg[128];
        snprintf(msg, sizeof msg, "tensor '%.60s' lacks %s", t->name,
                 !have_dtype ? "a dtype" : !have_shape ? "a shape" : "data_offsets");
        return perr(p, msg);
    }
    return 0;
}

static int parse_metadata(parser *p, ptl_st_file *f)
{
    size_t cap = 0;
    if (peek(p) == 'n')
        return skip_value(p, 1); /* null */
    if (expect(p, '{') < 0)
        return -1;
    if (peek(p) == '}') {
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
        if (parse_string(p, &f->meta_keys[i], &f->meta_key_lens[i]) < 0)
            return -1;
        f->meta_values[i] = NULL;
        f->nmeta++;
        if (expect(p, ':') < 0)
            return -1;
        if (peek(p) != '"')
            return perr(p, "__metadata__ values must be strings");
        if (parse_string(p, &f->meta_values[i], &f->meta_value_lens[i]) < 0)
            return -1;
        int d = take(p);
        if (d == '}')
            return 0;
        if (d != ',')
            return perr(p, "expected ',' or '}'");
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
    struct statx st; /* not fstat: that is a glibc 2.33 symbol, and the wheels run on glibc 2.28 */
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
    if (statx(f->fd, "", AT_EMPTY_PATH, STATX_TYPE | STATX_SIZE, &st) != 0) {
        ptl_set_error(PTL_ERR_OS, "cannot stat '%s': %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.stx_mode)) {
        ptl_set_error(PTL_ERR_OS, "'%s' is not a regular file", path);
        goto fail;
    }
    uint64_t size = (uint64_t)st.stx_size;
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

    parser p = {hdr, hdr + hlen, hdr, path, 0};
    if (peek(&p) != '{') {
        perr(&p, "header does not start with '{'");
        goto fail;
    }
    p.s++;
    if (peek(&p) == '}') {
        p.s++;
    } else {
        for (;;) {
            char *key = NULL;
            size_t key_len;
            if (parse_string(&p, &key, &key_len) < 0 || expect(&p, ':') < 0) {
                free(key);
                goto fail;
            }
            if (strcmp(key, "__metadata__") == 0) {
                free(key);
                if (f->nmeta > 0 || parse_metadata(&p, f) < 0) {
                    perr(&p, "bad or repeated __metadata__");
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
            int d = peek(&p);
            if (d != ',' && d != '}') {
                perr(&p, "expected ',' or '}'");
                goto fail;
            }
            p.s++;
            if (d == '}')
                break;
        }
    }
    skip_ws(&p);
    if (p.s != p.end) {
        perr(&p, "unexpected bytes after the header object");
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
