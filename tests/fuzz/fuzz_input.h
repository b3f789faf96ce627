/* What both fuzz targets share: the entry point libFuzzer calls, CHECK (a
 * failed invariant aborts, which libFuzzer reports with the input), and
 * reading the input as a stream of little-endian integers. Past the end
 * every read gives 0, so any input, however short, is a complete program. */
#ifndef DDHEAP_FUZZ_INPUT_H
#define DDHEAP_FUZZ_INPUT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #cond);                             \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

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
