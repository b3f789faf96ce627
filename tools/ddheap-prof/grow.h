/*
 * Growing an array the profiler appends to: one helper, so every such
 * array grows the same way and fails the same way when memory runs out.
 *
 *     if (dd_prof_grow(&p->exits, &p->exits_cap, p->nexits + 1, sizeof *p->exits) != 0)
 *         return -1;
 *     p->exits[p->nexits++] = e;
 */
#ifndef DDHEAP_PROF_GROW_H
#define DDHEAP_PROF_GROW_H

#include <stddef.h>

/* Makes room for `need` elements of elem_size bytes in the array whose
 * pointer is at vp (a T ** for an array of T, taken as void * so that any
 * T fits) and whose capacity, in elements, is *cap. Nothing happens when
 * *cap >= need. Otherwise the array is reallocated to twice its capacity
 * (16 elements at first), or to need if that is more, and *cap is set to
 * the new capacity: appending one element at a time costs amortised O(1).
 * The new elements are uninitialised.
 *
 * Returns 0, or -1 when out of memory (or when the size would overflow):
 * then neither the array's pointer nor *cap has changed, and the array
 * still holds what it held, so the caller alone decides what to drop. */
int dd_prof_grow(void *vp, size_t *cap, size_t need, size_t elem_size);

#endif
