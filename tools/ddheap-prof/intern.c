/* Interning tables (intern.h): open addressing, grown at half full. */
#include "intern.h"

#include <stdlib.h>
#include <string.h>

#include "grow.h"

static uint64_t hash_str(const char *s)
{
    uint64_t h = UINT64_C(1469598103934665603); /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * UINT64_C(1099511628211);
    return h;
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 31;
    x *= UINT64_C(0x7fb5d329728ea185);
    x ^= x >> 27;
    x *= UINT64_C(0x81dadef4bc2dd44d);
    return x ^ (x >> 33);
}

/* Rebuilds the slot array at twice the size; hash_of(i) rehashes entry i. */
static int rehash(uint32_t **slots, size_t *nslots, size_t n, uint64_t (*hash_of)(const void *, size_t),
                  const void *ctx)
{
    size_t cap = *nslots ? 2 * *nslots : 256;
    uint32_t *s = calloc(cap, sizeof *s);
    if (s == NULL)
        return -1;
    for (size_t i = 0; i < n; i++) {
        size_t j = hash_of(ctx, i) & (cap - 1);
        while (s[j])
            j = (j + 1) & (cap - 1);
        s[j] = (uint32_t)(i + 1);
    }
    free(*slots);
    *slots = s;
    *nslots = cap;
    return 0;
}

static uint64_t string_hash_of(const void *ctx, size_t i)
{
    return hash_str(((const struct dd_prof_strings *)ctx)->v[i]);
}

static uint64_t key_hash_of(const void *ctx, size_t i)
{
    return hash_u64(((const struct dd_prof_keys *)ctx)->v[i]);
}

long dd_prof_strings_intern(struct dd_prof_strings *t, const char *s)
{
    if (2 * (t->n + 1) > t->nslots && rehash(&t->slots, &t->nslots, t->n, string_hash_of, t))
        return -1;
    size_t mask = t->nslots - 1, j = hash_str(s) & mask;
    for (; t->slots[j]; j = (j + 1) & mask)
        if (strcmp(t->v[t->slots[j] - 1], s) == 0)
            return (long)t->slots[j] - 1;
    if (dd_prof_grow(&t->v, &t->cap, t->n + 1, sizeof *t->v) != 0)
        return -1;
    if ((t->v[t->n] = strdup(s)) == NULL)
        return -1;
    t->slots[j] = (uint32_t)(t->n + 1);
    return (long)t->n++;
}

void dd_prof_strings_free(struct dd_prof_strings *t)
{
    for (size_t i = 0; i < t->n; i++)
        free(t->v[i]);
    free(t->v);
    free(t->slots);
    memset(t, 0, sizeof *t);
}

long dd_prof_keys_intern(struct dd_prof_keys *t, uint64_t key, int *added)
{
    *added = 0;
    if (2 * (t->n + 1) > t->nslots && rehash(&t->slots, &t->nslots, t->n, key_hash_of, t))
        return -1;
    size_t mask = t->nslots - 1, j = hash_u64(key) & mask;
    for (; t->slots[j]; j = (j + 1) & mask)
        if (t->v[t->slots[j] - 1] == key)
            return (long)t->slots[j] - 1;
    if (dd_prof_grow(&t->v, &t->cap, t->n + 1, sizeof *t->v) != 0)
        return -1;
    t->v[t->n] = key;
    t->slots[j] = (uint32_t)(t->n + 1);
    *added = 1;
    return (long)t->n++;
}

void dd_prof_keys_free(struct dd_prof_keys *t)
{
    free(t->v);
    free(t->slots);
    memset(t, 0, sizeof *t);
}
