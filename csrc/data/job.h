/* A long data job (the dataset scan, filling a cache) run on its own thread, so that the Python thread can
 * wait for it in short slices, check for Ctrl-C between them, and cancel it. */
#ifndef PTL_DATA_JOB_H
#define PTL_DATA_JOB_H

#include <stdatomic.h>

/* The job: returns 0 or -1 with ptl_set_error; stops early (with an error) once *cancel is nonzero. */
typedef int (*ptl_job_fn)(void *arg, const atomic_int *cancel);

typedef struct ptl_job ptl_job;

int ptl_job_start(ptl_job_fn fn, void *arg, ptl_job **out);
/* 1 when the job has finished, 0 after timeout_ms without. */
int ptl_job_wait(ptl_job *j, int timeout_ms);
void ptl_job_cancel(ptl_job *j);
/* Waits for the job, frees it and returns its result; its error becomes this thread's. */
int ptl_job_join(ptl_job *j);

#endif
