/*
 * Two small interning tables the outputs share: strings to dense indices
 * (pprof's string table, function and folded-stack keys) and 64-bit keys
 * to dense indices (addresses to locations).
 */
#ifndef DDHEAP_PROF_INTERN_H
#define DDHEAP_PROF_INTERN_H

#include <stddef.h>
#include <stdint.h>

struct dd_prof_strings {
    char **v; /* v[i] is the string of index i (owned copies) */
    size_t n, cap;
    uint32_t *slots; /* index + 1, 0 empty */
    size_t nslots;
};

/* Index of s, added if new; -1 when out of memory. */
long dd_prof_strings_intern(struct dd_prof_strings *t, const char *s);
void dd_prof_strings_free(struct dd_prof_strings *t);

struct dd_prof_keys {
    uint64_t *v; /* v[i] is the key of index i */
    size_t n, cap;
    uint32_t *slots;
    size_t nslots;
};

/* Index of key, added if new (*added set to 1 then); -1 when out of memory. */
long dd_prof_keys_intern(struct dd_prof_keys *t, uint64_t key, int *added);
void dd_prof_keys_free(struct dd_prof_keys *t);

#endif
