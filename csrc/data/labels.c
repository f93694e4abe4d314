/* YOLO label files (§7.1) and the problem log the Python side turns into warnings. */
#include <errno.h>
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

int ptl_labels_read(const char *path, int nc, float **labels, int *n, ptl_log *lg, int *n_dup)
{
    FILE *f = fopen(path, "r");
    float *out = NULL, *vals = NULL;
    char *line = NULL;
    size_t linecap = 0;
    int cnt = 0, cap = 0, lineno = 0, rc = -1;
    *labels = NULL;
    *n = 0;
    if (!f)
        return 0; /* missing label file = no objects */
    vals = malloc(sizeof(float) * MAX_FIELDS);
    if (!vals) {
        ptl_set_error(PTL_ERR_MEMORY, "out of memory reading %s", path);
        goto done;
    }
    while (getline(&line, &linecap, f) >= 0) {
        lineno++;
        int nf = 0;
        char *p = line, *end;
        while (1) {
            while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n' || *p == ',')
                p++;
            if (!*p)
                break;
            if (nf == MAX_FIELDS) {
                if (ptl_log_add(lg, "%s:%d: more than %d fields; image skipped", path, lineno, MAX_FIELDS))
                    goto done;
                rc = 1;
                goto done;
            }
            errno = 0;
            double v = strtod(p, &end);
            if (end == p) {
                if (ptl_log_add(lg, "%s:%d: field %d is not a number; image skipped", path, lineno, nf + 1))
                    goto done;
                rc = 1;
                goto done;
            }
            vals[nf++] = (float)v;
            p = end;
        }
        if (nf == 0)
            continue;
        if (nf < 5 || (nf > 5 && (nf - 1) % 2 != 0) || (nf > 5 && nf < 7)) {
            if (ptl_log_add(lg, "%s:%d: %d fields, expected 5 (class cx cy w h) or a polygon; image skipped",
                            path, lineno, nf))
                goto done;
            rc = 1;
            goto done;
        }
        for (int i = 0; i < nf; i++)
            if (!isfinite(vals[i])) {
                if (ptl_log_add(lg, "%s:%d: field %d is not finite; image skipped", path, lineno, i + 1))
                    goto done;
                rc = 1;
                goto done;
            }
        float c = vals[0];
        if (c < 0 || c != floorf(c)) {
            if (ptl_log_add(lg, "%s:%d: class %g is not a non-negative integer; image skipped", path, lineno,
                            (double)c))
                goto done;
            rc = 1;
            goto done;
        }
        if (c >= (float)nc) {
            if (ptl_log_add(lg, "%s:%d: class %d exceeds the dataset's %d classes; image skipped", path, lineno,
                            (int)c, nc))
                goto done;
            rc = 1;
            goto done;
        }
        float box[4];
        if (nf == 5) {
            for (int i = 1; i < 5; i++)
                if (vals[i] < -0.01f || vals[i] > 1.01f) {
                    if (ptl_log_add(lg, "%s:%d: coordinate %g out of [0, 1]; image skipped", path, lineno,
                                    (double)vals[i]))
                        goto done;
                    rc = 1;
                    goto done;
                }
            memcpy(box, vals + 1, sizeof box);
        } else {
            float x1 = INFINITY, y1 = INFINITY, x2 = -INFINITY, y2 = -INFINITY;
            for (int i = 1; i < nf; i++)
                if (vals[i] < -0.01f || vals[i] > 1.01f) {
                    if (ptl_log_add(lg, "%s:%d: coordinate %g out of [0, 1]; image skipped", path, lineno,
                                    (double)vals[i]))
                        goto done;
                    rc = 1;
                    goto done;
                }
            for (int i = 1; i + 1 < nf; i += 2) {
                x1 = fminf(x1, vals[i]), x2 = fmaxf(x2, vals[i]);
                y1 = fminf(y1, vals[i + 1]), y2 = fmaxf(y2, vals[i + 1]);
            }
            box[0] = (x1 + x2) / 2, box[1] = (y1 + y2) / 2, box[2] = x2 - x1, box[3] = y2 - y1;
        }
        int dup = 0;
        for (int j = 0; j < cnt && !dup; j++)
            dup = out[5 * j] == c && memcmp(out + 5 * j + 1, box, sizeof box) == 0;
        if (dup) {
            if (ptl_log_add(lg, "%s:%d: duplicate row removed", path, lineno))
                goto done;
            (*n_dup)++;
            continue;
        }
        if (cnt == cap) {
            int nc2 = cap ? 2 * cap : 16;
            float *o = realloc(out, sizeof(float) * 5 * (size_t)nc2);
            if (!o) {
                ptl_set_error(PTL_ERR_MEMORY, "out of memory reading %s", path);
                goto done;
            }
            out = o;
            cap = nc2;
        }
        out[5 * cnt] = c;
        memcpy(out + 5 * cnt + 1, box, sizeof box);
        cnt++;
    }
    if (ferror(f)) {
        if (ptl_log_add(lg, "%s: read error; image skipped", path))
            goto done;
        rc = 1;
        goto done;
    }
    *labels = out;
    *n = cnt;
    out = NULL;
    rc = 0;
done:
    free(out);
    free(vals);
    free(line);
    fclose(f);
    return rc;
}
