/* YOLO label files (§7.1) and the problem log the Python side turns into warnings. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset.h"

int ptl_log_add(ptl_log *lg, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (lg->n == lg->cap) {
        int cap = lg->cap ? 2 * lg->cap : 16;
        char **m = realloc(lg->msg, sizeof(char *) * (size_t)cap);
        if (!m)
            return ptl_set_error(PTL_ERR_MEMORY, "out of memory logging a data problem");
        lg->msg = m;
        lg->cap = cap;
    }
    char *s = strdup(buf);
    if (!s)
        return ptl_set_error(PTL_ERR_MEMORY, "out of memory logging a data problem");
    lg->msg[lg->n++] = s;
    return 0;
}

void ptl_log_free(ptl_log *lg)
{
    for (int i = 0; i < lg->n; i++)
        free(lg->msg[i]);
    free(lg->msg);
    lg->msg = NULL;
    lg->n = lg->cap = 0;
}

#define MAX_FIELDS 4096

/* Rows kept so far for one image. */
typedef struct {
    float *b; /* 5 floats a row: cls cx cy w h */
    int n, cap;
} rows_t;

/* Checks one row of nf values (class, then 4 box or 2k polygon coordinates) found at `loc` and appends its
 * box unless it duplicates a kept row. Returns 0 (kept or a duplicate, reported), 1 when the image must be
 * skipped (reported), -1 on allocation failure. */
static int add_row(const char *loc, const float *vals, int nf, const ptl_label_rules *r, rows_t *out, ptl_log *lg,
                   int *n_dup)
{
#define SKIP(...)                                                                                               \
    do {                                                                                                        \
        return ptl_log_add(lg, __VA_ARGS__) ? -1 : 1;                                                           \
    } while (0)
    if (nf < 5 || (nf > 5 && (nf - 1) % 2 != 0) || (nf > 5 && nf < 7))
        SKIP("%s: %d fields, expected 5 (class cx cy w h) or a polygon; image skipped", loc, nf);
    for (int i = 0; i < nf; i++)
        if (!isfinite(vals[i]))
            SKIP("%s: field %d is not finite; image skipped", loc, i + 1);
    float c = vals[0];
    if (c < 0 || c != floorf(c))
        SKIP("%s: class %g is not a non-negative integer; image skipped", loc, (double)c);
    if (!r->single_cls && c >= (float)r->nc)
        SKIP("%s: class %d exceeds the dataset's %d classes; image skipped", loc, (int)c, r->nc);
    for (int i = 1; i < nf; i++)
        if (vals[i] < -0.01f || vals[i] > 1.01f)
            SKIP("%s: coordinate %g out of [0, 1]; image skipped", loc, (double)vals[i]);
#undef SKIP
    float box[4];
    if (nf == 5) {
        memcpy(box, vals + 1, sizeof box);
    } else {
        float x1 = INFINITY, y1 = INFINITY, x2 = -INFINITY, y2 = -INFINITY;
        for (int i = 1; i + 1 < nf; i += 2) {
            x1 = fminf(x1, vals[i]), x2 = fmaxf(x2, vals[i]);
            y1 = fminf(y1, vals[i + 1]), y2 = fmaxf(y2, vals[i + 1]);
        }
        box[0] = (x1 + x2) / 2, box[1] = (y1 + y2) / 2, box[2] = x2 - x1, box[3] = y2 - y1;
    }
    for (int j = 0; j < out->n; j++)
        if (out->b[5 * j] == c && memcmp(out->b + 5 * j + 1, box, sizeof box) == 0) {
            if (ptl_log_add(lg, "%s: duplicate row removed", loc))
                return -1;
            (*n_dup)++;
            return 0;
        }
    if (out->n == out->cap) {
        int cap = out->cap ? 2 * out->cap : 16;
        float *o = realloc(out->b, sizeof(float) * 5 * (size_t)cap);
        if (!o)
            return ptl_set_error(PTL_ERR_MEMORY, "out of memory reading the labels at %s", loc);
        out->b = o;
        out->cap = cap;
    }
    out->b[5 * out->n] = c;
    memcpy(out->b + 5 * out->n + 1, box, sizeof box);
    out->n++;
    return 0;
}

/* Hands the kept rows over (class 0 for single_cls, after the duplicates were found with the given classes). */
static void rows_finish(rows_t *rows, const ptl_label_rules *r, float **labels, int *n)
{
    if (r->single_cls)
        for (int j = 0; j < rows->n; j++)
            rows->b[5 * j] = 0.f;
    *labels = rows->b;
    *n = rows->n;
    rows->b = NULL;
}

int ptl_labels_rows(const char *name, const float *vals, int nrows, const ptl_label_rules *r, float **labels, int *n,
                    ptl_log *lg, int *n_dup)
{
    rows_t rows = {NULL, 0, 0};
    char loc[1100];
    *labels = NULL;
    *n = 0;
    for (int i = 0; i < nrows; i++) {
        snprintf(loc, sizeof loc, "%s: box %d", name, i + 1);
        int rc = add_row(loc, vals + 5 * (size_t)i, 5, r, &rows, lg, n_dup);
        if (rc != 0) {
            free(rows.b);
            return rc;
        }
    }
    rows_finish(&rows, r, labels, n);
    return 0;
}

int ptl_labels_read(const char *path, const ptl_label_rules *r, float **labels, int *n, int *found, ptl_log *lg,
                    int *n_dup)
{
    FILE *f = fopen(path, "r");
    rows_t rows = {NULL, 0, 0};
    float *vals = NULL;
    char *line = NULL, loc[1100];
    size_t linecap = 0;
    int lineno = 0, rc = -1;
    *labels = NULL;
    *n = 0;
    *found = f != NULL;
    if (!f)
        return 0; /* missing label file = no objects */
    vals = malloc(sizeof(float) * MAX_FIELDS);
    if (!vals) {
        ptl_set_error(PTL_ERR_MEMORY, "out of memory reading %s", path);
        goto done;
    }
    while (getline(&line, &linecap, f) >= 0) {
        lineno++;
        snprintf(loc, sizeof loc, "%s:%d", path, lineno);
        int nf = 0;
        char *p = line, *end;
        while (1) {
            while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n' || *p == ',')
                p++;
            if (!*p)
                break;
            if (nf == MAX_FIELDS) {
                rc = ptl_log_add(lg, "%s: more than %d fields; image skipped", loc, MAX_FIELDS) ? -1 : 1;
                goto done;
            }
            double v = strtod(p, &end);
            if (end == p) {
                rc = ptl_log_add(lg, "%s: field %d is not a number; image skipped", loc, nf + 1) ? -1 : 1;
                goto done;
            }
            vals[nf++] = (float)v;
            p = end;
        }
        if (nf == 0)
            continue;
        int k = add_row(loc, vals, nf, r, &rows, lg, n_dup);
        if (k != 0) {
            rc = k;
            goto done;
        }
    }
    if (ferror(f)) {
        rc = ptl_log_add(lg, "%s: read error; image skipped", path) ? -1 : 1;
        goto done;
    }
    rows_finish(&rows, r, labels, n);
    rc = 0;
done:
    free(rows.b);
    free(vals);
    free(line);
    fclose(f);
    return rc;
}
