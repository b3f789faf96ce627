/*
 * The process-wide half of ddheap: one object shared by every copy of the
 * library in the process, and the secret every copy derives identically.
 *
 * Why STB_GNU_UNIQUE: an executable and a shared library may each link
 * libddheap.a, and a block sampled by one copy can be freed through the
 * other. Both must then agree on "is any marked block live" and find the
 * same table. The dynamic linker binds every reference to a unique symbol
 * to one definition, even across RTLD_LOCAL dlopen; the executable's copy
 * takes part when it exports the symbol, which the pkg-config file and the
 * meson dependency arrange with --export-dynamic-symbol (docs/design.md).
 *
 * Why AT_RANDOM: the kernel's 16 random bytes are the same for every copy
 * and unknown to the program's input. The keys are SipHash-2-4 outputs
 * keyed by them, so revealing a key (through a leaked header) reveals
 * nothing about AT_RANDOM itself, which glibc also uses for the stack
 * protector canary.
 */
#include "internal.h"

#include <string.h>
#include <sys/auxv.h>

#define DDHEAP_SHARED_SIZE 262336 /* sizeof(struct ddheap__shared) */
#define DDHEAP_STR2(x) #x
#define DDHEAP_STR(x) DDHEAP_STR2(x)

_Static_assert(sizeof(struct ddheap__shared) == DDHEAP_SHARED_SIZE,
               "update DDHEAP_SHARED_SIZE (and the _v suffix if the layout changed)");

__asm__(".pushsection .bss.ddheap_shared_v2,\"aw\",%nobits\n"
        ".globl ddheap_shared_v2\n"
        ".type ddheap_shared_v2, %gnu_unique_object\n"
        ".size ddheap_shared_v2, " DDHEAP_STR(DDHEAP_SHARED_SIZE) "\n"
        ".balign 64\n"
        "ddheap_shared_v2:\n"
        ".zero " DDHEAP_STR(DDHEAP_SHARED_SIZE) "\n"
        ".popsection\n");

static inline uint64_t rotl64(uint64_t x, int r)
{
    return (x << r) | (x >> (64 - r));
}

#define SIPROUND                                                                                   \
    do {                                                                                           \
        v0 += v1;                                                                                  \
        v1 = rotl64(v1, 13);                                                                       \
        v1 ^= v0;                                                                                  \
        v0 = rotl64(v0, 32);                                                                       \
        v2 += v3;                                                                                  \
        v3 = rotl64(v3, 16);                                                                       \
        v3 ^= v2;                                                                                  \
        v0 += v3;                                                                                  \
        v3 = rotl64(v3, 21);                                                                       \
        v3 ^= v0;                                                                                  \
        v2 += v1;                                                                                  \
        v1 = rotl64(v1, 17);                                                                       \
        v1 ^= v2;                                                                                  \
        v2 = rotl64(v2, 32);                                                                       \
    } while (0)

/* SipHash-2-4 of one 8-byte message under a 128-bit key. */
static uint64_t siphash_u64(uint64_t k0, uint64_t k1, uint64_t message)
{
    uint64_t v0 = k0 ^ UINT64_C(0x736f6d6570736575);
    uint64_t v1 = k1 ^ UINT64_C(0x646f72616e646f6d);
    uint64_t v2 = k0 ^ UINT64_C(0x6c7967656e657261);
    uint64_t v3 = k1 ^ UINT64_C(0x7465646279746573);
    uint64_t last = UINT64_C(8) << 56; /* length byte, no tail */

    v3 ^= message;
    SIPROUND;
    SIPROUND;
    v0 ^= message;
    v3 ^= last;
    SIPROUND;
    SIPROUND;
    v0 ^= last;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

uint64_t ddheap_process_secret(uint64_t domain)
{
    uint64_t k[2] = {UINT64_C(0x6464686561702d31), UINT64_C(0x6e6f2d6174726e64)};
    const void *random16 = (const void *)getauxval(AT_RANDOM);
    /* Linux has passed AT_RANDOM since 2.6.29; without it the keys are
     * fixed and only the address binding of the check word remains. */
    if (random16)
        memcpy(k, random16, sizeof k);
    return siphash_u64(k[0], k[1], domain);
}

void ddheap_ensure_keys(void)
{
    struct ddheap__shared *s = &ddheap_shared_v2;
    if (__atomic_load_n(&s->keys_ready, __ATOMIC_ACQUIRE))
        return;
    /* Every copy computes the same values, so racing writers agree. */
    __atomic_store_n(&s->key_filter, ddheap_process_secret(4), __ATOMIC_RELAXED);
    __atomic_store_n(&s->key_xor, ddheap_process_secret(1), __ATOMIC_RELAXED);
    /* key_mul last, with release ordering: the header code takes a
     * non-zero key_mul (it is odd) as "keys ready" (mark_header.h). */
    __atomic_store_n(&s->key_mul, ddheap_process_secret(2) | 1, __ATOMIC_RELEASE);
    __atomic_store_n(&s->keys_ready, 1, __ATOMIC_RELEASE);
}

uint64_t ddheap_test_live_marked(void)
{
    return __atomic_load_n(&ddheap_shared_v2.live_marked, __ATOMIC_RELAXED);
}
