/* Runtime-API program.  Built twice: linked against the fake libcudart.so.13
 * (prog_runtime) and with fake_cudart.c compiled in (prog_runtime_static,
 * like nvcc's default static cudart).
 * Usage: prog_runtime [exit-code] */
#include <stdlib.h>

#include "workload.h"

int main(int argc, char **argv)
{
    if (workload_run() != 0)
        return 1;
    return argc > 1 ? atoi(argv[1]) : 0;
}
