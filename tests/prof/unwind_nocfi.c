/*
 * test_unwind.py's c-nocfi test: main (with CFI) calls nocfi_middle
 * (unwind_nocfi_mid.c: no CFI, frame pointers) calls nocfi_site (with
 * CFI), which allocates. A DWARF unwind of the site's stack must take the
 * frame-pointer step through nocfi_middle and go on by CFI to main.
 */
#include <stdio.h>
#include <stdlib.h>

void nocfi_site(int n);
void nocfi_middle(int n);
static volatile unsigned long sink;

__attribute__((noinline)) void nocfi_site(int n)
{
    for (int i = 0; i < n; i++) {
        char *p = malloc(100000);
        if (p == NULL)
            abort();
        p[0] = 1;
        sink += (unsigned char)p[0];
        free(p);
    }
    sink++;
}

int main(int argc, char **argv)
{
    nocfi_middle(argc > 1 ? atoi(argv[1]) : 3000);
    printf("%lu\n", sink);
    return 0;
}
