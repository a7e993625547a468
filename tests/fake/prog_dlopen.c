/* Loads libplugin.so with dlopen(RTLD_NOW | RTLD_LOCAL) and runs it; the
 * program itself has no dependency on libcudart.
 * Usage: prog_dlopen [exit-code] */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"

int main(int argc, char **argv)
{
    void *h = dlopen("libplugin.so", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        FAIL("dlopen: %s", dlerror());
    int (*run)(void) = (int (*)(void))dlsym(h, "plugin_run");
    if (!run)
        FAIL("dlsym(plugin_run): %s", dlerror());
    if (run() != 0)
        return 1;
    return argc > 1 ? atoi(argv[1]) : 0;
}
