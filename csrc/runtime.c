#include <stdlib.h>
#include <string.h>

#include "ops/cast.h"
#include "runtime_impl.h"

ptl_runtime *ptl_runtime_create(void)
{
    ptl_runtime *rt = calloc(1, sizeof *rt);
    if (!rt)
        return NULL;
    pthread_mutex_init(&rt->lock, NULL);
    rt->refs = 1;
    rt->device_count = -1;
    return rt;
}

static void runtime_unref(ptl_runtime *rt)
{
    if (__atomic_sub_fetch(&rt->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
#ifdef PTL_WITH_CUDA
    for (int i = 0; i < PTL_MAX_DEVICES; i++)
        if (rt->ctx[i])
            ptl_cuda_ctx_destroy(rt->ctx[i]);
#endif
    pthread_mutex_destroy(&rt->lock);
    free(rt);
}

void ptl_runtime_release(ptl_runtime *rt) { runtime_unref(rt); }

int ptl_cuda_device_count(ptl_runtime *rt)
{
#ifdef PTL_WITH_CUDA
    pthread_mutex_lock(&rt->lock);
    if (rt->device_count < 0)
        rt->device_count = ptl_cuda_count();
    int n = rt->device_count;
    pthread_mutex_unlock(&rt->lock);
    return n;
#else
    (void)rt;
    return 0;
#endif
}

int ptl_storage_new(ptl_runtime *rt, ptl_device dev, size_t nbytes, ptl_storage **out)
{
    ptl_storage *s = calloc(1, sizeof *s);
    if (!s)
        return ptl_set_error(PTL_ERR_MEMORY, "out of host memory");
    s->refcount = 1;
    s->nbytes = nbytes;
    s->device = dev;
    s->rt = rt;
    if (dev.type == PTL_CPU) {
        /* 64-byte alignment for vector loads; at least one byte so data is never NULL */
        if (posix_memalign(&s->data, 64, nbytes ? (nbytes + 63) & ~(size_t)63 : 64) != 0) {
            ptl_set_error(PTL_ERR_MEMORY, "out of host memory allocating %zu bytes", nbytes);
            goto fail;
        }
    } else {
#ifdef PTL_WITH_CUDA
        PTL_CHECK(ptl_cuda_storage_alloc(rt, s));
#else
        ptl_set_error(PTL_ERR_VALUE, "ptl was built without CUDA");
        goto fail;
#endif
    }
    __atomic_add_fetch(&rt->refs, 1, __ATOMIC_ACQ_REL);
    *out = s;
    return 0;
fail:
    free(s);
    return -1;
}

int ptl_storage_borrow(ptl_runtime *rt, ptl_device dev, void *data, size_t nbytes, ptl_storage **out)
{
    ptl_storage *s = calloc(1, sizeof *s);
    if (!s)
        return ptl_set_error(PTL_ERR_MEMORY, "out of host memory");
    *s = (ptl_storage){.refcount = 1, .data = data, .nbytes = nbytes, .device = dev, .rt = rt, .borrowed = 1};
    __atomic_add_fetch(&rt->refs, 1, __ATOMIC_ACQ_REL);
    *out = s;
    return 0;
}

void ptl_storage_incref(ptl_storage *s) { __atomic_add_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL); }

void ptl_storage_decref(ptl_storage *s)
{
    if (!s || __atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    ptl_runtime *rt = s->rt;
    if (!s->borrowed && s->device.type == PTL_CPU)
        free(s->data);
#ifdef PTL_WITH_CUDA
    else if (!s->borrowed)
        ptl_cuda_storage_free(s);
#endif
    free(s);
    runtime_unref(rt);
}

int ptl_copy_bytes(ptl_runtime *rt, void *dst, ptl_device dst_dev, const void *src, ptl_device src_dev,
                   size_t nbytes)
{
    if (nbytes == 0)
        return 0;
    if (dst_dev.type == PTL_CPU && src_dev.type == PTL_CPU) {
        memcpy(dst, src, nbytes);
        return 0;
    }
#ifdef PTL_WITH_CUDA
    return ptl_cuda_copy_bytes(rt, dst, dst_dev, src, src_dev, nbytes);
#else
    (void)rt;
    return ptl_set_error(PTL_ERR_VALUE, "ptl was built without CUDA");
#endif
}

int ptl_convert(ptl_runtime *rt, ptl_device dev, void *dst, ptl_dtype ddt, const void *src, ptl_dtype sdt, int64_t n)
{
    if (dev.type == PTL_CPU) {
        cast_cpu(dst, ddt, src, sdt, n);
        return 0;
    }
#ifdef PTL_WITH_CUDA
    return ptl_cuda_convert(rt, dev.index, dst, ddt, src, sdt, n);
#else
    (void)rt;
    return ptl_set_error(PTL_ERR_VALUE, "ptl was built without CUDA");
#endif
}

int ptl_memset_device(ptl_runtime *rt, ptl_device dev, void *ptr, int value, size_t nbytes)
{
    if (dev.type == PTL_CPU) {
        memset(ptr, value, nbytes);
        return 0;
    }
#ifdef PTL_WITH_CUDA
    return ptl_cuda_memset(rt, dev.index, ptr, value, nbytes);
#else
    (void)rt;
    return ptl_set_error(PTL_ERR_VALUE, "ptl was built without CUDA");
#endif
}
