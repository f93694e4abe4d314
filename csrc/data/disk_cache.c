/* Disk cache files (cache="disk"): one per image, a 64-byte header then the resized RGB pixels, read back
 * by mapping the file. The header holds what the pixels depend on (the image file's size and mtime, its
 * displayed size, the resized size, the JPEG DCT-scaling threshold) and a CRC of itself; a file whose
 * header or length does not match is rebuilt. Files are written to a temporary name in the same folder,
 * flushed and renamed, so a killed writer leaves the previous file (or none), never a partial one. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include "../file_info.h"
#include "loader_impl.h"

#define HEADER_BYTES 64
#define VERSION 1

static void put64(unsigned char *p, int64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)((uint64_t)v >> (8 * i));
}

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* The header of key k (little-endian): magic, version, header size, the key, CRC-32 of bytes 0..55. */
static void header_of(const ptl_dcache_key *k, unsigned char h[HEADER_BYTES])
{
    memset(h, 0, HEADER_BYTES);
    memcpy(h, "PTLCACHE", 8);
    put32(h + 8, VERSION);
    put32(h + 12, HEADER_BYTES);
    put64(h + 16, k->src_size);
    put64(h + 24, k->src_mtime_ns);
    put32(h + 32, (uint32_t)k->w0);
    put32(h + 36, (uint32_t)k->h0);
    put32(h + 40, (uint32_t)k->w);
    put32(h + 44, (uint32_t)k->h);
    put64(h + 48, k->scale_pixels);
    put32(h + 56, (uint32_t)crc32(0L, h, 56));
}

static size_t file_bytes(const ptl_dcache_key *k) { return HEADER_BYTES + (size_t)k->w * k->h * 3; }

int ptl_dcache_valid(const char *path, const ptl_dcache_key *k)
{
    unsigned char want[HEADER_BYTES], got[HEADER_BYTES];
    ptl_file_info st;
    int fd = open(path, O_RDONLY | O_CLOEXEC), ok = 0;
    if (fd < 0)
        return 0;
    header_of(k, want);
    if (ptl_file_info_get(fd, NULL, &st) == 0 && st.size == file_bytes(k) && pread(fd, got, HEADER_BYTES, 0) == HEADER_BYTES)
        ok = memcmp(want, got, HEADER_BYTES) == 0;
    close(fd);
    return ok;
}

int ptl_dcache_map(const char *path, const ptl_dcache_key *k, const uint8_t **px, void **map, size_t *len)
{
    unsigned char want[HEADER_BYTES];
    ptl_file_info st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    size_t n = file_bytes(k);
    if (fd < 0)
        return 1;
    if (ptl_file_info_get(fd, NULL, &st) != 0 || st.size != n) {
        close(fd);
        return 1;
    }
    void *p = mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return 1;
    header_of(k, want);
    if (memcmp(p, want, HEADER_BYTES) != 0) {
        munmap(p, n);
        return 1;
    }
    *px = (const uint8_t *)p + HEADER_BYTES;
    *map = p;
    *len = n;
    return 0;
}

void ptl_dcache_unmap(void *map, size_t len)
{
    if (map)
        munmap(map, len);
}

static int write_all(int fd, const void *p, size_t n)
{
    const unsigned char *b = p;
    while (n > 0) {
        ssize_t k = write(fd, b, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

int ptl_dcache_write(const char *path, const ptl_dcache_key *k, const uint8_t *px)
{
    static atomic_uint counter;
    unsigned char h[HEADER_BYTES];
    char tmp[4200];
    int n = snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&counter, 1));
    if (n < 0 || (size_t)n >= sizeof tmp)
        return ptl_set_error(PTL_ERR_OS, "disk cache path too long: %s", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        return ptl_set_error(PTL_ERR_OS, "cannot write the disk cache file %s: %s", tmp, strerror(errno));
    header_of(k, h);
    int bad = write_all(fd, h, HEADER_BYTES) != 0 || write_all(fd, px, (size_t)k->w * k->h * 3) != 0 ||
              fdatasync(fd) != 0;
    int err = errno;
    if (close(fd) != 0 && !bad)
        bad = 1, err = errno;
    if (!bad && rename(tmp, path) != 0)
        bad = 1, err = errno;
    if (bad) {
        unlink(tmp);
        return ptl_set_error(PTL_ERR_OS, "cannot write the disk cache file %s: %s", path, strerror(err));
    }
    return 0;
}
