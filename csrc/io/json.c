/* JSON text of safetensors headers; see json.h. */
#include "json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../ptl.h"

/* ---------------------------------------------------------------- growable text buffer */

void ptl_sb_put(ptl_strbuf *b, const char *s, size_t n)
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

void ptl_sb_str(ptl_strbuf *b, const char *s) { ptl_sb_put(b, s, strlen(s)); }

void ptl_sb_fmt(ptl_strbuf *b, const char *fmt, ...)
{
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    ptl_sb_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

void ptl_sb_json_string(ptl_strbuf *b, const char *s)
{
    ptl_sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            char e[2] = {'\\', (char)*p};
            ptl_sb_put(b, e, 2);
        } else if (*p < 0x20) {
            ptl_sb_fmt(b, "\\u%04x", *p);
        } else {
            ptl_sb_put(b, (const char *)p, 1);
        }
    }
    ptl_sb_put(b, "\"", 1);
}

/* ---------------------------------------------------------------- UTF-8 */

int ptl_utf8_check(const char *s, size_t n, size_t *bad_at)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = u[i];
        size_t k;
        unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF) {
            k = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            k = 2;
            if (c == 0xE0)
                lo = 0xA0; /* overlong */
            if (c == 0xED)
                hi = 0x9F; /* surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            k = 3;
            if (c == 0xF0)
                lo = 0x90; /* overlong */
            if (c == 0xF4)
                hi = 0x8F; /* past U+10FFFF */
        } else {
            *bad_at = i;
            return -1;
        }
        if (n - i <= k || u[i + 1] < lo || u[i + 1] > hi) {
            *bad_at = i;
            return -1;
        }
        for (size_t j = 2; j <= k; j++)
            if (u[i + j] < 0x80 || u[i + j] > 0xBF) {
                *bad_at = i;
                return -1;
            }
        i += k + 1;
    }
    return 0;
}

/* ---------------------------------------------------------------- parser */

int ptl_json_fail(ptl_json *p, const char *fmt, ...)
{
    if (!p->failed) {
        char msg[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        ptl_set_error(PTL_ERR_VALUE, "'%s' is not a valid safetensors file: %s at header byte %ld", p->path, msg,
                      (long)(p->s - p->start));
    }
    p->failed = 1;
    return -1;
}

void ptl_json_skip_ws(ptl_json *p)
{
    while (p->s < p->end && (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r'))
        p->s++;
}

int ptl_json_peek(ptl_json *p)
{
    ptl_json_skip_ws(p);
    return p->s < p->end ? (unsigned char)*p->s : -1;
}

int ptl_json_take(ptl_json *p)
{
    int c = ptl_json_peek(p);
    if (c >= 0)
        p->s++;
    return c;
}

int ptl_json_expect(ptl_json *p, char c)
{
    ptl_json_skip_ws(p);
    if (p->s >= p->end || *p->s != c)
        return ptl_json_fail(p, "expected '%c'", c);
    p->s++;
    return 0;
}

static int hex4(ptl_json *p, unsigned *out)
{
    if (p->end - p->s < 4)
        return ptl_json_fail(p, "truncated \\u escape");
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
            return ptl_json_fail(p, "bad \\u escape");
    }
    *out = v;
    return 0;
}

static void put_code_point(ptl_strbuf *b, unsigned cp)
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
    ptl_sb_put(b, u, k);
}

/* A \uXXXX escape (the backslash and 'u' consumed), a surrogate pair joined into one code point. */
static int unicode_escape(ptl_json *p, unsigned *cp)
{
    if (hex4(p, cp) < 0)
        return -1;
    if (*cp >= 0xD800 && *cp < 0xDC00) {
        unsigned lo;
        if (p->end - p->s < 2 || p->s[0] != '\\' || p->s[1] != 'u')
            return ptl_json_fail(p, "unpaired surrogate");
        p->s += 2;
        if (hex4(p, &lo) < 0)
            return -1;
        if (lo < 0xDC00 || lo > 0xDFFF)
            return ptl_json_fail(p, "unpaired surrogate");
        *cp = 0x10000 + ((*cp - 0xD800) << 10) + (lo - 0xDC00);
    } else if (*cp >= 0xDC00 && *cp < 0xE000) {
        return ptl_json_fail(p, "unpaired surrogate");
    }
    if (*cp == 0)
        return ptl_json_fail(p, "NUL character in string");
    return 0;
}

int ptl_json_string(ptl_json *p, char **out, size_t *out_len)
{
    ptl_strbuf b = {0};
    if (ptl_json_expect(p, '"') < 0)
        return -1;
    for (;;) {
        if (p->s >= p->end) {
            ptl_json_fail(p, "unterminated string");
            goto fail;
        }
        unsigned char c = (unsigned char)*p->s++;
        if (c == '"')
            break;
        if (c < 0x20) {
            ptl_json_fail(p, "control character in string");
            goto fail;
        }
        if (c != '\\') {
            ptl_sb_put(&b, (const char *)&c, 1);
            continue;
        }
        if (p->s >= p->end) {
            ptl_json_fail(p, "unterminated string");
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
            if (unicode_escape(p, &cp) < 0)
                goto fail;
            put_code_point(&b, cp);
            continue;
        default:
            ptl_json_fail(p, "bad escape in string");
            goto fail;
        }
        ptl_sb_put(&b, &ch, 1);
    }
    if (!b.s && !b.oom)
        ptl_sb_put(&b, "", 0);
    if (b.oom) {
        ptl_set_error(PTL_ERR_MEMORY, "load_safetensors: out of host memory");
        p->failed = 1;
        goto fail;
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

int ptl_json_uint(ptl_json *p, uint64_t *out)
{
    ptl_json_skip_ws(p);
    if (p->s >= p->end || *p->s < '0' || *p->s > '9')
        return ptl_json_fail(p, "expected a non-negative integer");
    uint64_t v = 0;
    while (p->s < p->end && *p->s >= '0' && *p->s <= '9') {
        unsigned d = (unsigned)(*p->s++ - '0');
        if (v > (UINT64_MAX - d) / 10)
            return ptl_json_fail(p, "integer too large");
        v = v * 10 + d;
    }
    if (p->s < p->end && (*p->s == '.' || *p->s == 'e' || *p->s == 'E'))
        return ptl_json_fail(p, "expected an integer");
    *out = v;
    return 0;
}

int ptl_json_uint_array(ptl_json *p, uint64_t *vals, int max, int *count, const char *what)
{
    *count = 0;
    if (ptl_json_expect(p, '[') < 0)
        return -1;
    if (ptl_json_peek(p) == ']') {
        p->s++;
        return 0;
    }
    for (;;) {
        if (*count == max)
            return ptl_json_fail(p, "%s has more than %d entries", what, max);
        if (ptl_json_uint(p, &vals[(*count)++]) < 0)
            return -1;
        int d = ptl_json_take(p);
        if (d == ']')
            return 0;
        if (d != ',')
            return ptl_json_fail(p, "expected ',' or ']'");
    }
}

int ptl_json_skip_value(ptl_json *p, int depth)
{
    int c = ptl_json_peek(p);
    if (depth > 64)
        return ptl_json_fail(p, "nesting too deep");
    if (c == '"')
        return ptl_json_string(p, NULL, NULL);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        p->s++;
        if (ptl_json_peek(p) == close) {
            p->s++;
            return 0;
        }
        for (;;) {
            if (c == '{') {
                if (ptl_json_string(p, NULL, NULL) < 0 || ptl_json_expect(p, ':') < 0)
                    return -1;
            }
            if (ptl_json_skip_value(p, depth + 1) < 0)
                return -1;
            int d = ptl_json_take(p);
            if (d == close)
                return 0;
            if (d != ',')
                return ptl_json_fail(p, "expected ',' or a closing bracket");
        }
    }
    static const char *const lits[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t k = strlen(lits[i]);
        if ((size_t)(p->end - p->s) >= k && memcmp(p->s, lits[i], k) == 0) {
            p->s += k;
            return 0;
        }
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        while (p->s < p->end && *p->s && strchr("+-0123456789.eE", *p->s))
            p->s++;
        return 0;
    }
    return ptl_json_fail(p, "expected a value");
}
