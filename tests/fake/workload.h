/* Runtime-API workload shared by prog_runtime (shared and static builds) and
 * libplugin.so (loaded by prog_dlopen). */
#ifndef WORKLOAD_H
#define WORKLOAD_H

/* Runs the workload, prints the final "result: ..." line and returns 0, or
 * prints "result: FAIL ..." and returns 1. */
int workload_run(void);

/* Sizes of the allocations the workload deliberately leaks. */
#define LEAK_MALLOC 1000003u
#define LEAK_ASYNC 2000003u
#define LEAK_MANAGED 3000017u
#define LEAK_PITCH_WIDTH 500u
#define LEAK_PITCH_HEIGHT 7u
#define LEAK_PITCH_BYTES (512u * LEAK_PITCH_HEIGHT) /* pitch rounds 500 up to 512 */

#endif
