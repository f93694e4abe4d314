/* Failure injection for tests (never armed in normal use): a test arms one stage with
 * ptl_fault_arm; the next ptl_fault_hit of that stage disarms it and fails with an error naming the
 * stage, exactly where a real failure of that stage would be reported. It only sets an error: it
 * cannot stop a process. */
#ifndef PTL_FAULT_H
#define PTL_FAULT_H

#include "ptl.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    PTL_FAULT_NONE = 0,
    PTL_FAULT_UPLOAD,
    PTL_FAULT_FORWARD,
    PTL_FAULT_OBJECTIVE,
    PTL_FAULT_BACKWARD,
    PTL_FAULT_OPTIMIZER,
    PTL_FAULT_EMA,
    PTL_FAULT_NUM
} ptl_fault_stage;

/* The stage's name ("upload", "forward", ...), or NULL. */
const char *ptl_fault_name(ptl_fault_stage s);
/* Arms `s` (PTL_FAULT_NONE disarms). */
void ptl_fault_arm(ptl_fault_stage s);
/* 0, or -1 after setting PTL_ERR_RUNTIME "injected failure at <stage>" when `s` is armed (then disarmed). */
int ptl_fault_hit(ptl_fault_stage s);

#ifdef __cplusplus
}
#endif

#endif
