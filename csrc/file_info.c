#define _GNU_SOURCE /* statx */
#include "file_info.h"

#include <fcntl.h>
#include <sys/stat.h>

int ptl_file_info_get(int fd, const char *path, ptl_file_info *out)
{
    struct statx st;
    int rc = path ? statx(AT_FDCWD, path, 0, STATX_TYPE | STATX_SIZE | STATX_MTIME, &st)
                  : statx(fd, "", AT_EMPTY_PATH, STATX_TYPE | STATX_SIZE | STATX_MTIME, &st);
    if (rc != 0)
        return -1;
    out->is_regular = S_ISREG(st.stx_mode);
    out->size = st.stx_size;
    out->mtime_ns = (int64_t)st.stx_mtime.tv_sec * 1000000000LL + st.stx_mtime.tv_nsec;
    return 0;
}
