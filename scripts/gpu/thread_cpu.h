// The calling thread's CPU time in seconds (CLOCK_THREAD_CPUTIME_ID): what
// the probes that time threads against each other divide by their calls.
#pragma once
#include <time.h>

static double thread_cpu_s() {
    timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
