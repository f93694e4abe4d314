/* The JSON of a safetensors header: a growable text buffer with JSON string escaping (for the writer),
 * a UTF-8 check, and a small bounded parser over one header held in memory (for the reader). Parse
 * errors name the file and the header byte. Internal to csrc/io. */
#ifndef PTL_IO_JSON_H
#define PTL_IO_JSON_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    char *s; /* NUL-terminated while len > 0 */
    size_t len, cap;
    int oom; /* an allocation failed: later puts do nothing */
} ptl_strbuf;

void ptl_sb_put(ptl_strbuf *b, const char *s, size_t n);
void ptl_sb_str(ptl_strbuf *b, const char *s);
void ptl_sb_fmt(ptl_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* s as a quoted JSON string (quotes and backslashes escaped, control characters as \u00XX). */
void ptl_sb_json_string(ptl_strbuf *b, const char *s);

/* 0 when s[0..n) is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF);
 * otherwise -1 with *bad_at the offset of the first byte of the bad sequence. */
int ptl_utf8_check(const char *s, size_t n, size_t *bad_at);

typedef struct {
    const char *s, *end, *start; /* cursor, end and start of the header text */
    const char *path;            /* for error messages */
    int failed;                  /* the first error is the one reported */
} ptl_json;

/* Sets "'<path>' is not a valid safetensors file: <message> at header byte N" (the first error only). */
int ptl_json_fail(ptl_json *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ptl_json_skip_ws(ptl_json *p);
/* The next non-space character, or -1 at the end (nothing consumed). */
int ptl_json_peek(ptl_json *p);
/* The next non-space character, consumed; -1 (nothing consumed) at the end. */
int ptl_json_take(ptl_json *p);
int ptl_json_expect(ptl_json *p, char c);
/* A string as malloc'd UTF-8 (NUL-terminated; an escaped NUL is rejected); out may be NULL to skip it. */
int ptl_json_string(ptl_json *p, char **out, size_t *out_len);
int ptl_json_uint(ptl_json *p, uint64_t *out);
/* [u, u, ...] with at most max entries. */
int ptl_json_uint_array(ptl_json *p, uint64_t *vals, int max, int *count, const char *what);
/* Skips any value (for keys the reader does not use); nesting deeper than 64 is an error. */
int ptl_json_skip_value(ptl_json *p, int depth);

#endif
