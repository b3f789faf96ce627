/* Reading a libFuzzer input as a stream of little-endian integers, shared
 * by both targets. Past the end every read gives 0, so any input, however
 * short, is a complete program. */
#ifndef DDHEAP_FUZZ_INPUT_H
#define DDHEAP_FUZZ_INPUT_H

#include <stddef.h>
#include <stdint.h>

struct input {
    const uint8_t *p;
    size_t left;
};

static inline uint64_t take(struct input *in, unsigned bytes)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < bytes && in->left; i++, in->left--)
        v |= (uint64_t)*in->p++ << (8 * i);
    return v;
}

#endif /* DDHEAP_FUZZ_INPUT_H */
