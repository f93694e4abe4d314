/* A file's type, size and modification time, through statx: stat/fstat are glibc 2.33 symbols and the
 * wheels must run on glibc 2.28 (tools/manylinux.py), where statx exists. */
#ifndef PTL_FILE_INFO_H
#define PTL_FILE_INFO_H

#include <stdint.h>

typedef struct {
    int is_regular;
    uint64_t size;
    int64_t mtime_ns;
} ptl_file_info;

/* 0 on success; -1 with errno set. `path` relative to the working directory, or fd >= 0 with path NULL. */
int ptl_file_info_get(int fd, const char *path, ptl_file_info *out);

#endif
