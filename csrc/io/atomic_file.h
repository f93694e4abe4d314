/* Atomic file writes: the bytes go to a temporary file beside the destination, named
 *   <path>.tmp.<pid>.<thread id>.<n>
 * (ptl/io.py recognises exactly these names when it removes the leftovers of killed writes); commit
 * fsyncs it, renames it over the destination and fsyncs the folder, so a crash leaves either the old
 * file or the new one, and at worst a stray temporary file. */
#ifndef PTL_IO_ATOMIC_FILE_H
#define PTL_IO_ATOMIC_FILE_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int fd;
    char *path, *tmp;
    int64_t written;
    int64_t fail_after; /* the test fault taken over at open (< 0: none) */
    int pause_ms;
} ptl_atomic_file;

/* Creates the temporary file. On failure nothing is left behind. */
int ptl_atomic_open(ptl_atomic_file *f, const char *path);
int ptl_atomic_write(ptl_atomic_file *f, const void *data, size_t n);
/* fsync, rename over the destination, fsync the folder; the handle is released either way. */
int ptl_atomic_commit(ptl_atomic_file *f);
/* Closes and removes the temporary file (a no-op after commit). */
void ptl_atomic_abort(ptl_atomic_file *f);

/* Test hook, reached only through the private binding _C._atomic_write_fault: the next atomic write
 * opened after this call fails once it has written after_bytes bytes, as a full disk would (ENOSPC);
 * with pause_ms > 0 it first waits that long at that point, so that a test can kill the process from
 * outside while the write is half done. after_bytes < 0 disarms. The hook never ends a process. */
void ptl_atomic_set_fault(int64_t after_bytes, int pause_ms);

#endif
