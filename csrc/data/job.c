/* A job on its own thread (job.h); its error state is thread-local, so it is copied out at the end. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../ptl.h"
#include "job.h"

struct ptl_job {
    ptl_job_fn fn;
    void *arg;
    atomic_int cancel;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, rc;
    ptl_error_kind kind;
    char msg[1024];
};

static void *job_main(void *p)
{
    ptl_job *j = p;
    int rc = j->fn(j->arg, &j->cancel);
    pthread_mutex_lock(&j->mu);
    j->rc = rc;
    if (rc != 0) {
        j->kind = ptl_error_kind_get();
        snprintf(j->msg, sizeof j->msg, "%s", ptl_error_message());
    }
    j->done = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

int ptl_job_start(ptl_job_fn fn, void *arg, ptl_job **out)
{
    ptl_job *j = calloc(1, sizeof *j);
    *out = NULL;
    if (!j)
        return ptl_set_error(PTL_ERR_MEMORY, "out of memory starting a data job");
    j->fn = fn;
    j->arg = arg;
    atomic_init(&j->cancel, 0);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    if (pthread_create(&j->thread, NULL, job_main, j) != 0) {
        pthread_mutex_destroy(&j->mu);
        pthread_cond_destroy(&j->cv);
        free(j);
        return ptl_set_error(PTL_ERR_RUNTIME, "cannot start a data job thread");
    }
    *out = j;
    return 0;
}

int ptl_job_wait(ptl_job *j, int timeout_ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L)
        until.tv_sec++, until.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&j->mu);
    while (!j->done && pthread_cond_timedwait(&j->cv, &j->mu, &until) == 0)
        ;
    int done = j->done;
    pthread_mutex_unlock(&j->mu);
    return done;
}

void ptl_job_cancel(ptl_job *j) { atomic_store(&j->cancel, 1); }

int ptl_job_join(ptl_job *j)
{
    pthread_join(j->thread, NULL);
    int rc = j->rc;
    if (rc != 0)
        ptl_set_error(j->kind, "%s", j->msg);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
    return rc;
}
