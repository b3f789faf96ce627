/* A library the tests load with dlopen after the program started: what it
 * allocates must go through the same malloc as the rest (preload), or be
 * rewritten when it is loaded (in-process interposition). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

uint64_t dd_interpose_plugin_work(unsigned rounds);

uint64_t dd_interpose_plugin_work(unsigned rounds)
{
    uint64_t h = 0;
    char **kept = calloc(rounds, sizeof *kept);
    if (kept == NULL)
        return 0;
    for (unsigned i = 0; i < rounds; i++) {
        size_t n = 64 + (i * 37u) % 5000u;
        kept[i] = malloc(n);
        memset(kept[i], (int)(i & 0x7f), n);
        if (i % 3 == 0)
            kept[i] = realloc(kept[i], n * 2);
    }
    for (unsigned i = 0; i < rounds; i++) {
        h = h * 31 + (unsigned char)kept[i][i % 64];
        free(kept[i]);
    }
    free(kept);
    return h;
}
