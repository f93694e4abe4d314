/* Thread-local error state: library code may fail on threads without the GIL. */
#include <stdarg.h>
#include <stdio.h>

#include "ptl.h"

static _Thread_local ptl_error_kind err_kind;
static _Thread_local char err_msg[1024];

int ptl_set_error(ptl_error_kind kind, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_msg, sizeof err_msg, fmt, ap);
    va_end(ap);
    err_kind = kind;
    return -1;
}

ptl_error_kind ptl_error_kind_get(void) { return err_kind; }

const char *ptl_error_message(void) { return err_msg; }

void ptl_error_clear(void)
{
    err_kind = PTL_ERR_NONE;
    err_msg[0] = 0;
}
