#include "threads.h"

#include <omp.h>

int ptl_cpu_threads(void) { return omp_get_max_threads(); }
