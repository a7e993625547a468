/* Never touches CUDA.  Prints "hello <args>" and exits with argv[1] as the
 * status when given. */
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    printf("hello");
    for (int i = 1; i < argc; i++)
        printf(" %s", argv[i]);
    printf("\n");
    return argc > 1 ? atoi(argv[1]) : 0;
}
