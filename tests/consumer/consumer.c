/* A program outside the project that uses an installed (or subproject)
 * ddheap exactly as the README says: it must compile, link and sample. */
#include <ddheap.h>
#include <ddheap/testing.h>
#include <stdio.h>
#include <stdlib.h>

static unsigned long long reported;

static void count(const dd_probe_event_t *ev, void *ctx)
{
    (void)ctx;
    reported += ev->kind == DD_PROBE_ALLOC;
}

int main(void)
{
    ddheap_test_set_probe_hook(count, NULL);
    dd_heap_simulate_tracer(true);
    dd_set_default_sampling_interval(1);
    for (int i = 1; i <= 100; i++) {
        dd_alloc_req_t req = dd_allocation_requested((size_t)i, 0);
        void *p = dd_allocation_created(malloc(req.size), req);
        free(dd_allocation_freed(p, 0, 0).ptr);
    }
    printf("consumer: %llu allocations reported\n", reported);
    return reported == 100 ? 0 : 1;
}
