/* Part of tests/fake/sites.c, compiled without unwind tables and without a
 * frame pointer: the unwinder must stop or step over it, never crash. */
__attribute__((noinline)) void nounwind_call(void (*f)(void))
{
    f();
    __asm__ volatile("" ::: "memory");
}
