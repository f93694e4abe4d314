/* Shared libraries opened at run time instead of linked: looked up in the Python wheels that ship them
 * (under a site-packages folder), then on the system library path, and their functions resolved by
 * name. The CUDA build opens cuBLAS and cuDNN this way (cuda/dynload.c), so the extension loads on
 * machines without them and says which package to install when they are first needed. */
#ifndef PTL_DYNLIB_H
#define PTL_DYNLIB_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PTL_DYNLIB_MAX_WHEEL_DIRS 2

typedef struct {
    const char *name;                                 /* as users know it: "cuDNN" */
    const char *soname;                               /* "libcudnn.so.9" */
    const char *wheel_dirs[PTL_DYNLIB_MAX_WHEEL_DIRS]; /* below a site-packages folder; NULL-padded */
    const char *package;                              /* the pip wheel that ships it: "nvidia-cudnn-cu13" */
    const char *extra;                                /* what installs that wheel: "ptl[cuda]" */
    const char *const *symbols;                       /* NULL-terminated names to resolve */
    void **const *slots;                              /* where each symbol's address is stored */
} ptl_dynlib;

/* The folders (sys.path entries) whose wheel_dirs are searched, in order; copied. */
int ptl_dynlib_set_roots(const char *const *roots, int n);

/* Opens `lib`: <root>/<wheel_dir>/<soname> for each root and wheel_dir in order, then <soname> through
 * the system loader (LD_LIBRARY_PATH, the ldconfig cache, the default folders); then fills `slots`.
 * The file opened goes to `path` (cap bytes; may be NULL). On failure (PTL_ERR_CUDA) the message names
 * the library, how to install it and where it looked, or the symbol it lacks. Not thread-safe: the
 * caller serialises. */
int ptl_dynlib_open(const ptl_dynlib *lib, char *path, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
