// Preloaded by scripts/gpu-exit-crash.sh: on SIGSEGV, SIGBUS or SIGABRT prints the
// native stack (module+offset, and the dynamic symbol where there is one) to
// stderr, then dies of the same signal. Tells a crash of the program (seen
// without cupool too) from one of the shim.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
static void h(int sig, siginfo_t *si, void *uc) {
    void *f[64];
    int n = backtrace(f, 64);
    fprintf(stderr, "\n=== segv_bt: signal %d addr %p tid %ld, %d frames\n", sig, si->si_addr, (long)syscall(SYS_gettid), n);
    for (int i = 0; i < n; i++) {
        Dl_info d;
        if (dladdr(f[i], &d) && d.dli_fname) {
            fprintf(stderr, "  #%d %p %s+0x%lx %s\n", i, f[i], d.dli_fname, (unsigned long)((char *)f[i] - (char *)d.dli_fbase), d.dli_sname ? d.dli_sname : "");
        } else fprintf(stderr, "  #%d %p ?\n", i, f[i]);
    }
    signal(sig, SIG_DFL);
    raise(sig);
}
__attribute__((constructor)) static void init(void) {
    struct sigaction a; memset(&a, 0, sizeof a);
    a.sa_sigaction = h; a.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigaction(SIGSEGV, &a, 0); sigaction(SIGBUS, &a, 0); sigaction(SIGABRT, &a, 0);
}
