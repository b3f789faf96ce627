/*
 * A plugin with its own copy of libddheap.a, compiled -fPIC: its inlined
 * free path tests its own free gate (ddheap/coldpath.h) before anything
 * else. test_free_gate.c loads it (linked, and by dlopen under a second
 * name) to check that a block sampled by another copy is never freed
 * through a closed gate.
 */
#include <ddheap.h>
#include <stdint.h>
#include <stdlib.h>

void *gate_plugin_malloc(size_t size);
void gate_plugin_free(void *ptr);
uint8_t gate_plugin_gate(void);

void *gate_plugin_malloc(size_t size)
{
    dd_alloc_req_t req = dd_allocation_requested(size, 0);
    return dd_allocation_created(malloc(req.size), req);
}

void gate_plugin_free(void *ptr)
{
    dd_alloc_freed_t f = dd_allocation_freed(ptr, 0, 0);
    free(f.ptr);
}

uint8_t gate_plugin_gate(void)
{
    return __atomic_load_n(&ddheap__free_gate, __ATOMIC_RELAXED);
}
