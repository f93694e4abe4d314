/* Atomic file writes; see atomic_file.h. */
#include "atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../ptl.h"

static pthread_mutex_t fault_lock = PTHREAD_MUTEX_INITIALIZER;
static int64_t fault_after = -1;
static int fault_pause_ms = 0;

void ptl_atomic_set_fault(int64_t after_bytes, int pause_ms)
{
    pthread_mutex_lock(&fault_lock);
    fault_after = after_bytes;
    fault_pause_ms = pause_ms > 0 ? pause_ms : 0;
    pthread_mutex_unlock(&fault_lock);
}

/* The armed fault goes to exactly one write: the next one opened. */
static void take_fault(ptl_atomic_file *f)
{
    pthread_mutex_lock(&fault_lock);
    f->fail_after = fault_after;
    f->pause_ms = fault_pause_ms;
    fault_after = -1;
    fault_pause_ms = 0;
    pthread_mutex_unlock(&fault_lock);
}

static void pause_for(int ms)
{
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
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

static void release(ptl_atomic_file *f)
{
    free(f->path);
    free(f->tmp);
    f->path = f->tmp = NULL;
    f->fd = -1;
}

int ptl_atomic_open(ptl_atomic_file *f, const char *path)
{
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->fail_after = -1;
    size_t tlen = strlen(path) + 64;
    f->path = strdup(path);
    f->tmp = (char *)malloc(tlen);
    if (!f->path || !f->tmp) {
        ptl_set_error(PTL_ERR_MEMORY, "writing '%s': out of host memory", path);
        goto fail;
    }
    /* process and thread ids keep concurrent writers apart; the attempt number steps over files left
     * by a killed process that had the same ids */
    for (int attempt = 0; f->fd < 0; attempt++) {
        snprintf(f->tmp, tlen, "%s.tmp.%ld.%ld.%d", path, (long)getpid(), (long)syscall(SYS_gettid), attempt);
        f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (f->fd < 0 && (errno != EEXIST || attempt > 100)) {
            ptl_set_error(PTL_ERR_OS, "cannot create '%s': %s", f->tmp, strerror(errno));
            goto fail;
        }
    }
    take_fault(f);
    return 0;
fail:
    release(f);
    return -1;
}

int ptl_atomic_write(ptl_atomic_file *f, const void *data, size_t n)
{
    const char *p = (const char *)data;
    while (n > 0) {
        size_t chunk = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
        if (f->fail_after >= 0 && f->written + (int64_t)chunk > f->fail_after) {
            chunk = (size_t)(f->fail_after - f->written);
            if (chunk == 0) {
                if (f->pause_ms > 0)
                    pause_for(f->pause_ms);
                return ptl_set_error(PTL_ERR_OS, "writing '%s': %s (injected failure after %lld bytes)", f->path,
                                     strerror(ENOSPC), (long long)f->written);
            }
        }
        ssize_t k = write(f->fd, p, chunk);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return ptl_set_error(PTL_ERR_OS, "writing '%s': %s", f->path, strerror(errno));
        }
        p += k;
        n -= (size_t)k;
        f->written += k;
    }
    return 0;
}

int ptl_atomic_commit(ptl_atomic_file *f)
{
    char *dir = NULL;
    if (fsync(f->fd) != 0) {
        ptl_set_error(PTL_ERR_OS, "writing '%s': fsync of '%s' failed: %s", f->path, f->tmp, strerror(errno));
        goto fail;
    }
    int rc = close(f->fd);
    f->fd = -1;
    if (rc != 0) {
        ptl_set_error(PTL_ERR_OS, "writing '%s': closing '%s' failed: %s", f->path, f->tmp, strerror(errno));
        goto fail;
    }
    if (rename(f->tmp, f->path) != 0) {
        ptl_set_error(PTL_ERR_OS, "cannot rename '%s' to '%s': %s", f->tmp, f->path, strerror(errno));
        goto fail;
    }
    /* make the rename itself durable; folders that cannot be fsynced are left as they are */
    dir = dir_of(f->path);
    int dfd = dir ? open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    free(dir);
    release(f);
    return 0;
fail:
    ptl_atomic_abort(f);
    return -1;
}

void ptl_atomic_abort(ptl_atomic_file *f)
{
    if (f->fd >= 0)
        close(f->fd);
    if (f->tmp)
        unlink(f->tmp);
    release(f);
}
