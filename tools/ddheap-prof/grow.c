/* Growing arrays (grow.h). */
#include "grow.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The capacity of an array's first allocation, in elements. */
#define FIRST_CAP 16

int dd_prof_grow(void *vp, size_t *cap, size_t need, size_t elem_size)
{
    if (need <= *cap)
        return 0;
    size_t most = SIZE_MAX / elem_size;
    if (need > most)
        return -1;
    size_t c = *cap ? *cap : FIRST_CAP / 2;
    c = c <= most / 2 ? 2 * c : most;
    if (c < need)
        c = need;
    /* The pointer is copied in and out rather than read through a
     * void **: the caller's is a T *, which may not be accessed as a
     * void * (strict aliasing). */
    void *old;
    memcpy(&old, vp, sizeof old);
    void *grown = realloc(old, c * elem_size);
    if (grown == NULL)
        return -1;
    memcpy(vp, &grown, sizeof grown);
    *cap = c;
    return 0;
}
