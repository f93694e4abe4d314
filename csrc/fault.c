/* Failure injection for tests (fault.h). */
#include "fault.h"

#include <stdatomic.h>

static atomic_int armed;

static const char *const names[PTL_FAULT_NUM] = {NULL, "upload", "forward", "objective", "backward", "optimizer", "ema"};

const char *ptl_fault_name(ptl_fault_stage s) { return s > PTL_FAULT_NONE && s < PTL_FAULT_NUM ? names[s] : NULL; }

void ptl_fault_arm(ptl_fault_stage s) { atomic_store(&armed, (int)s); }

int ptl_fault_hit(ptl_fault_stage s)
{
    int want = (int)s;
    if (s == PTL_FAULT_NONE || !atomic_compare_exchange_strong(&armed, &want, PTL_FAULT_NONE))
        return 0;
    return ptl_set_error(PTL_ERR_RUNTIME, "injected failure at stage '%s' (a test armed it)", names[s]);
}
