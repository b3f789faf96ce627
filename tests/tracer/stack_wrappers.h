/*
 * The allocator of the stack test (tests/tracer, test "stacks"): libc's
 * malloc family wired to ddheap the way the top of <ddheap.h> shows, in a
 * file of its own as a user's allocator would be.
 */
#ifndef DDHEAP_TEST_STACK_WRAPPERS_H
#define DDHEAP_TEST_STACK_WRAPPERS_H

#include <stddef.h>

void *stack_malloc(size_t size);
void *stack_aligned_alloc(size_t alignment, size_t size);
void *stack_realloc(void *ptr, size_t size);
void stack_free(void *ptr);

#endif
