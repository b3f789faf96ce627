/*
 * A minimal program linked against libddheap.a, for check_probe_notes.py:
 * the notes a tracer reads are those of the linked program, so that is what
 * the check looks at. Running it samples one block and frees it.
 */
#include <ddheap.h>

#include <stdlib.h>

int main(void)
{
    dd_heap_simulate_tracer(true);
    dd_set_default_sampling_interval(1);
    dd_alloc_req_t req = dd_allocation_requested(64, 0);
    void *p = dd_allocation_created(malloc(req.size), req);
    void *q = NULL;
    if (p) {
        dd_realloc_prep_t prep = dd_allocation_realloc_prepare(p, 128);
        q = dd_allocation_realloc_commit(p, realloc(prep.raw_ptr, prep.raw_size), prep);
    }
    dd_alloc_freed_t f = dd_allocation_freed(q ? q : p, 0, 0);
    free(f.ptr);
    return p && q ? 0 : 1;
}
