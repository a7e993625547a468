/* libplugin.so: a shared object with DT_NEEDED on libcudart.so.13, loaded by
 * prog_dlopen with RTLD_LOCAL the way Python loads extension modules. */
#include "workload.h"

__attribute__((visibility("default"))) int plugin_run(void) { return workload_run(); }
