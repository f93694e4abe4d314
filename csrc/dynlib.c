/* Run-time loading of shared libraries from Python wheels or the system library path (dynlib.h). */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dynlib.h"
#include "ptl.h"

static pthread_mutex_t roots_lock = PTHREAD_MUTEX_INITIALIZER;
static char **roots;
static int num_roots;

int ptl_dynlib_set_roots(const char *const *list, int n)
{
    char **copy = calloc(n > 0 ? (size_t)n : 1, sizeof *copy);
    if (!copy)
        return ptl_set_error(PTL_ERR_MEMORY, "out of host memory");
    for (int i = 0; i < n; i++) {
        copy[i] = strdup(list[i]);
        if (!copy[i]) {
            while (i-- > 0)
                free(copy[i]);
            free(copy);
            return ptl_set_error(PTL_ERR_MEMORY, "out of host memory");
        }
    }
    pthread_mutex_lock(&roots_lock);
    char **old = roots;
    int old_n = num_roots;
    roots = copy;
    num_roots = n;
    pthread_mutex_unlock(&roots_lock);
    for (int i = 0; i < old_n; i++)
        free(old[i]);
    free(old);
    return 0;
}

/* Appends `s` to the message being built in buf (len bytes used of cap), truncating quietly. */
static void append(char *buf, size_t cap, size_t *len, const char *s)
{
    if (*len + 1 >= cap)
        return;
    int n = snprintf(buf + *len, cap - *len, "%s", s);
    if (n > 0)
        *len += (size_t)n < cap - *len ? (size_t)n : cap - *len - 1;
}

/* dlerror() as text (it may be NULL). */
static const char *load_error(void)
{
    const char *e = dlerror();
    return e ? e : "unknown error";
}

/* Opens the first wheel candidate that exists, else asks the system loader. Returns the handle, or
 * NULL with the loader's message in `failure`; `*in_wheel` tells whether a wheel file was the one
 * that failed (it is not skipped: a broken install should be reported, not bypassed). `looked` lists
 * the wheel paths tried. */
static void *open_first(const ptl_dynlib *lib, char *path, size_t cap, char *looked, size_t looked_cap,
                        char *failure, size_t failure_cap, int *in_wheel)
{
    size_t looked_len = 0;
    int found = 0;
    char cand[4096];
    pthread_mutex_lock(&roots_lock);
    for (int r = 0; r < num_roots && !found; r++)
        for (int w = 0; w < PTL_DYNLIB_MAX_WHEEL_DIRS && lib->wheel_dirs[w] && !found; w++) {
            snprintf(cand, sizeof cand, "%s/%s/%s", roots[r], lib->wheel_dirs[w], lib->soname);
            found = access(cand, F_OK) == 0;
            if (!found) {
                append(looked, looked_cap, &looked_len, cand);
                append(looked, looked_cap, &looked_len, ", ");
            }
        }
    pthread_mutex_unlock(&roots_lock);
    *in_wheel = found;
    void *h = dlopen(found ? cand : lib->soname, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(path, cap, "%s", found ? cand : lib->soname);
        snprintf(failure, failure_cap, "%s", load_error());
        return NULL;
    }
    if (found) {
        snprintf(path, cap, "%s", cand);
        return h;
    }
    /* the file the system loader chose: the object holding any of its symbols */
    Dl_info info;
    void *first = lib->symbols[0] ? dlsym(h, lib->symbols[0]) : NULL;
    snprintf(path, cap, "%s", first && dladdr(first, &info) && info.dli_fname ? info.dli_fname : lib->soname);
    return h;
}

int ptl_dynlib_open(const ptl_dynlib *lib, char *path, size_t cap)
{
    char looked[512] = "", failure[384] = "", where[1024] = "";
    int in_wheel = 0;
    if (!path) {
        path = where;
        cap = sizeof where;
    }
    void *h = open_first(lib, path, cap, looked, sizeof looked, failure, sizeof failure, &in_wheel);
    if (!h && in_wheel)
        return ptl_set_error(PTL_ERR_CUDA, "%s at %s could not be loaded: %s. Reinstall it with `pip install "
                             "--force-reinstall %s`", lib->name, path, failure, lib->package);
    if (!h)
        return ptl_set_error(PTL_ERR_CUDA, "%s (%s) could not be loaded: %s. Install it with `pip install %s` (the %s "
                             "wheel) or put it on the system library path. Looked in: %sthe system library path",
                             lib->name, lib->soname, failure, lib->extra, lib->package, looked);
    for (int i = 0; lib->symbols[i]; i++) {
        void *fn = dlsym(h, lib->symbols[i]);
        if (!fn)
            return ptl_set_error(PTL_ERR_CUDA, "%s at %s lacks %s: it is older than the %s ptl was built against; "
                                 "install a newer one with `pip install -U %s`", lib->name, path, lib->symbols[i],
                                 lib->soname, lib->package);
        *lib->slots[i] = fn;
    }
    return 0;
}
