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

#include <pthread.h>
#include <string.h>
#include <sys/auxv.h>

#define DDHEAP_SHARED_SIZE 1311552 /* sizeof(struct ddheap__shared) */
#define DDHEAP_STR2(x) #x
#define DDHEAP_STR(x) DDHEAP_STR2(x)

_Static_assert(sizeof(struct ddheap__shared) == DDHEAP_SHARED_SIZE,
               "update DDHEAP_SHARED_SIZE (and the _v suffix if the layout changed)");

__asm__(".pushsection .bss.ddheap_shared_v3,\"aw\",%nobits\n"
        ".globl ddheap_shared_v3\n"
        ".type ddheap_shared_v3, %gnu_unique_object\n"
        ".size ddheap_shared_v3, " DDHEAP_STR(DDHEAP_SHARED_SIZE) "\n"
        ".balign 64\n"
        "ddheap_shared_v3:\n"
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
     * fixed and only the address binding of the header remains. */
    if (random16)
        memcpy(k, random16, sizeof k);
    return siphash_u64(k[0], k[1], domain);
}

/*
 * Free gates (ddheap__free_gate, coldpath.h). Each copy registers the
 * address of its gate in the shared object from its constructor; the
 * first block marked in the process (any copy) opens them all first: keys
 * are derived on the first mark, not before, and opening the gates is part
 * of it. A gate is closed (0) only by its own copy's registration, and only
 * if the gates were not open yet. Orderings are sequentially consistent, so
 * that of "a copy registers, then reads free_gates_open" and "an opener
 * sets free_gates_open, then reads the slots", at least one sees the other:
 * a copy never closes its gate after an opener passed its slot.
 *
 * Slots are claimed (bit 0) while an opener writes through them and cleared
 * by a copy's destructor before dlclose unmaps its gate, which waits for a
 * claim to be released: an opener never writes into an unloaded copy.
 * Openers run with the thread's reentry guard held, so a signal handler on
 * the same thread never samples (and never opens) meanwhile. A child
 * forked while another thread held a claim would wait for it for ever (at
 * its first mark, or in that copy's destructor at exit): the fork handler
 * below finishes such writes in the child and drops the claims.
 */
#define GATE_UNKNOWN 1u
#define GATE_OPEN 2u
#define SLOT_CLAIMED ((uintptr_t)1)

/* The gate byte, starting at GATE_UNKNOWN, laid out in assembly as the
 * shared object is: AddressSanitizer would otherwise add an ODR-indicator
 * symbol outside ddheap's namespace beside a C global. */
__asm__(".pushsection .data.ddheap__free_gate,\"aw\",%progbits\n"
        ".globl ddheap__free_gate\n"
        ".hidden ddheap__free_gate\n"
        ".type ddheap__free_gate, %object\n"
        ".size ddheap__free_gate, 1\n"
        "ddheap__free_gate:\n"
        ".byte 1\n" /* GATE_UNKNOWN */
        ".popsection\n");

#if !DDHEAP_MARK_TBI
static uint32_t free_gate_slot = UINT32_MAX;

static void finish_claims_in_child(void);

void ddheap_register_free_gate(void)
{
    struct ddheap__shared *s = &ddheap_shared_v3;
    if (free_gate_slot != UINT32_MAX)
        return;
    uint32_t slot = __atomic_fetch_add(&s->free_gate_count, 1, __ATOMIC_SEQ_CST);
    if (slot >= DDHEAP__FREE_GATES)
        return; /* no room: the gate stays "unknown", frees check live_marked */
    __atomic_store_n(&s->free_gates[slot], (uintptr_t)&ddheap__free_gate, __ATOMIC_SEQ_CST);
    free_gate_slot = slot;
    /* Every copy registers the handler; running it twice is harmless.
     * (pthread_atfork only fails for lack of memory: the child then keeps
     * the tiny window described above.) */
    (void)pthread_atfork(NULL, NULL, finish_claims_in_child);
    if (__atomic_load_n(&s->free_gates_open, __ATOMIC_SEQ_CST) == 0) {
        uint8_t unknown = GATE_UNKNOWN;
        __atomic_compare_exchange_n(&ddheap__free_gate, &unknown, 0, false, __ATOMIC_SEQ_CST,
                                    __ATOMIC_RELAXED);
    }
}

static void open_one_gate(uintptr_t *slot)
{
    for (;;) {
        uintptr_t gate = __atomic_load_n(slot, __ATOMIC_SEQ_CST);
        if (gate == 0)
            return; /* never registered, or unloaded */
        if (gate & SLOT_CLAIMED)
            continue; /* another opener is writing through it: wait, then see */
        if (__atomic_compare_exchange_n(slot, &gate, gate | SLOT_CLAIMED, false, __ATOMIC_SEQ_CST,
                                        __ATOMIC_RELAXED)) {
            __atomic_store_n((uint8_t *)gate, GATE_OPEN, __ATOMIC_SEQ_CST);
            __atomic_store_n(slot, gate, __ATOMIC_SEQ_CST);
            return;
        }
    }
}

static void open_free_gates(struct ddheap__shared *s)
{
    __atomic_store_n(&s->free_gates_open, 1, __ATOMIC_SEQ_CST);
    uint32_t count = __atomic_load_n(&s->free_gate_count, __ATOMIC_SEQ_CST);
    if (count > DDHEAP__FREE_GATES)
        count = DDHEAP__FREE_GATES;
    for (uint32_t i = 0; i < count; i++)
        open_one_gate(&s->free_gates[i]);
}

/* In a child just forked, only the forking thread exists: a claim is a
 * write that will never finish. The claimed gate is still mapped (its
 * destructor was waiting for the claim, if it had begun). */
static void finish_claims_in_child(void)
{
    struct ddheap__shared *s = &ddheap_shared_v3;
    for (uint32_t i = 0; i < DDHEAP__FREE_GATES; i++) {
        uintptr_t gate = __atomic_load_n(&s->free_gates[i], __ATOMIC_RELAXED);
        if (gate & SLOT_CLAIMED) {
            __atomic_store_n((uint8_t *)(gate & ~SLOT_CLAIMED), GATE_OPEN, __ATOMIC_RELAXED);
            __atomic_store_n(&s->free_gates[i], gate & ~SLOT_CLAIMED, __ATOMIC_RELAXED);
        }
    }
}

/* dlclose: no opener may write into this copy once it is unmapped. */
__attribute__((destructor)) static void unregister_free_gate(void)
{
    struct ddheap__shared *s = &ddheap_shared_v3;
    if (free_gate_slot == UINT32_MAX)
        return;
    uintptr_t *slot = &s->free_gates[free_gate_slot];
    uintptr_t mine = (uintptr_t)&ddheap__free_gate;
    for (;;) {
        uintptr_t expected = mine; /* not claimed */
        if (__atomic_compare_exchange_n(slot, &expected, 0, false, __ATOMIC_SEQ_CST,
                                        __ATOMIC_RELAXED))
            break;
        if (expected != (mine | SLOT_CLAIMED))
            break; /* not ours any more (cannot happen) */
    }
    free_gate_slot = UINT32_MAX;
}
#endif

void ddheap_ensure_keys(void)
{
    struct ddheap__shared *s = &ddheap_shared_v3;
    if (__atomic_load_n(&s->keys_ready, __ATOMIC_ACQUIRE))
        return;
#if !DDHEAP_MARK_TBI
    /* Before any block can be marked: the keys are published below. */
    ddheap__thread_state.busy++;
    open_free_gates(s);
    ddheap__thread_state.busy--;
#endif
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
#if DDHEAP_MARK_SHADOW
    return __atomic_load_n(&ddheap_shared_v3.shadow_live, __ATOMIC_RELAXED);
#else
    return __atomic_load_n(&ddheap_shared_v3.live_marked, __ATOMIC_RELAXED);
#endif
}
