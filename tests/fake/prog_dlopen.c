/* Loads libplugin.so with dlopen(RTLD_NOW | RTLD_LOCAL) and runs it; the
 * program itself has no dependency on libcudart.
 * Usage: prog_dlopen [exit-code] */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    void *h = dlopen("libplugin.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("result: FAIL dlopen: %s\n", dlerror());
        return 1;
    }
    int (*run)(void) = (int (*)(void))dlsym(h, "plugin_run");
    if (!run) {
        printf("result: FAIL dlsym(plugin_run): %s\n", dlerror());
        return 1;
    }
    if (run() != 0)
        return 1;
    return argc > 1 ? atoi(argv[1]) : 0;
}
