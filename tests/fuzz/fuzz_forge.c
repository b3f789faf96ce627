/*
 * libFuzzer target: forged headers. In a slab, the 16 bytes before an
 * unsampled object are its neighbour's tail, i.e. data an attacker may
 * control. This target samples a few real blocks inside an arena, then
 * fills the 16 bytes before other (unsampled) positions of the arena with
 * input-chosen bytes:
 *
 *   - raw input bytes;
 *   - an exact copy of a real header taken from a sampled block;
 *   - such a copy with its meta word edited by input bits, or with both
 *     words XOR-adjusted by the distance between the two addresses (the
 *     edit that would defeat a tag in which address and fields only meet
 *     by XOR);
 *   - the right filter word for the position (key_filter is no secret to
 *     whoever saw one header: it is the first word XOR the address) with
 *     an input-chosen meta word, or with a tag computed with guessed keys;
 *
 * and frees each position. No forged header may be accepted: the free must
 * hand back exactly the pointer and size it was given, and report nothing.
 * Page-start positions (no header room, looked up in the page table while
 * page-aligned sampled blocks live) are included. Finally the real sampled
 * blocks must still be recognised, so the check can fail both ways.
 */
#include <ddheap.h>
#include <ddheap/testing.h>

#include "fuzz_input.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAGE 4096u
#define SAMPLED_PAGES 8u /* real sampled blocks live in the first pages (one each) */
#define FORGE_PAGES 8u   /* forgeries go anywhere: beside them (slab neighbours) or further */
#define MAX_SAMPLED 8

static unsigned char *arena;
static unsigned long frees_reported;

static void hook(const dd_probe_event_t *ev, void *ctx)
{
    (void)ctx;
    if (ev->kind == DD_PROBE_FREE)
        frees_reported++;
}


struct sampled {
    unsigned char *user;
    unsigned char *raw;
    size_t size, alignment;
    unsigned char header[16];
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct input in = {data, size};
    if (arena == NULL) {
        arena = aligned_alloc(PAGE, (SAMPLED_PAGES + FORGE_PAGES) * PAGE);
        CHECK(arena != NULL);
    }
    memset(arena, 0, (SAMPLED_PAGES + FORGE_PAGES) * PAGE);
    ddheap_test_set_probe_hook(hook, NULL);
    dd_heap_simulate_tracer(true);
    dd_set_default_sampling_interval(1);
    uint64_t marked_before = ddheap_test_live_marked();

    /* Real sampled blocks, one per page of the first half, at input-chosen
     * offsets and alignments (page alignment puts one in the table). */
    struct sampled real[MAX_SAMPLED];
    int nreal = 1 + (int)(take(&in, 1) % MAX_SAMPLED);
    for (int i = 0; i < nreal; i++) {
        struct sampled *s = &real[i];
        static const size_t aligns[] = {0, 16, 32, 64, 256, 2048, 4096};
        s->alignment = aligns[take(&in, 1) % 7];
        s->size = 1 + take(&in, 1) % 512;
        dd_alloc_req_t req = dd_allocation_requested(s->size, s->alignment);
        CHECK(req.weight != 0);
        size_t step = s->alignment > 16 ? s->alignment : 16;
        unsigned char *page = arena + (size_t)i * PAGE;
        size_t room = PAGE - req.size; /* raw + req.size stays inside the page */
        s->raw = page + (s->alignment >= PAGE ? 0 : (take(&in, 1) * step) % (room + 1) / step * step);
        s->user = dd_allocation_created(s->raw, req);
        CHECK(s->user != NULL && s->user >= s->raw && s->user + s->size <= page + PAGE);
        /* A table entry has no header: copy whatever lies there instead. */
        if (s->user >= arena + 16)
            memcpy(s->header, s->user - 16, 16);
        else
            memset(s->header, 0, 16);
    }
    CHECK(ddheap_test_live_marked() == marked_before + (uint64_t)nreal);
    /* What a forger learns from one leaked header: its first word XOR its
     * address is key_filter. */
    uint64_t leaked_filter_key = 0;
    for (int i = 0; i < nreal; i++) {
        if (((uintptr_t)real[i].user & (PAGE - 1)) >= 16) {
            uint64_t word;
            memcpy(&word, real[i].header, 8);
            leaked_filter_key = word ^ (uint64_t)(uintptr_t)real[i].user;
            break;
        }
    }

    /* Forgeries anywhere in the arena outside the real blocks (their raw
     * blocks, headers included, are the application's live memory). */
    unsigned long reported = frees_reported;
    while (in.left >= 4) {
        uint8_t how = (uint8_t)take(&in, 1);
        const struct sampled *src = &real[how % nreal];
        uint64_t where = take(&in, 2);
        unsigned char *y;
        if (how & 0x80) /* a neighbour in the same page as a real block, as in a slab */
            y = (unsigned char *)((uintptr_t)src->user ^ (where & (PAGE - 1)));
        else
            y = arena + where % ((SAMPLED_PAGES + FORGE_PAGES) * PAGE);
        if (y < arena + 16)
            y = arena + 16;
        bool inside = false;
        for (int i = 0; i < nreal; i++)
            inside |= y >= real[i].raw && y - 16 < real[i].user + real[i].size;
        if (inside)
            continue;
        unsigned char h[16];
        uint64_t check, meta;
        switch ((how >> 3) & 7) {
        case 0: /* raw bytes */
            for (int i = 0; i < 16; i++)
                h[i] = (uint8_t)take(&in, 1);
            break;
        case 1: /* an exact copy */
            memcpy(h, src->header, 16);
            break;
        case 2: /* a copy with input bits flipped in meta (offset, extra, reported) */
            memcpy(h, src->header, 16);
            memcpy(&meta, h + 8, 8);
            meta ^= take(&in, 8);
            memcpy(h + 8, &meta, 8);
            break;
        case 3: /* a copy whose two words absorb the address difference */
            memcpy(h, src->header, 16);
            memcpy(&check, h, 8);
            memcpy(&meta, h + 8, 8);
            check ^= (uint64_t)((uintptr_t)y ^ (uintptr_t)src->user);
            meta ^= (uint64_t)((uintptr_t)y ^ (uintptr_t)src->user) << (take(&in, 1) & 31);
            memcpy(h, &check, 8);
            memcpy(h + 8, &meta, 8);
            break;
        case 4: /* a copy shifted by a few bytes, as a misaligned neighbour would hold it */
            memcpy(h, src->header + 8, 8);
            memcpy(h + 8, src->header, 8);
            break;
        case 5: /* the leaked filter key, an input-chosen meta word */
            check = leaked_filter_key ^ (uint64_t)(uintptr_t)y;
            meta = take(&in, 8);
            memcpy(h, &check, 8);
            memcpy(h + 8, &meta, 8);
            break;
        default: { /* the leaked filter key, a tag computed with guessed keys */
            uint64_t fields = take(&in, 3) & 0x1ffff;
            uint64_t guess_xor = take(&in, 8), guess_mul = take(&in, 8) | 1;
            uint64_t a = ((uint64_t)(uintptr_t)y ^ guess_xor) * guess_mul;
            a = (a >> 32 | a << 32) ^ fields;
            check = leaked_filter_key ^ (uint64_t)(uintptr_t)y;
            meta = fields | ((a * guess_mul) & ~UINT64_C(0x1ffff));
            memcpy(h, &check, 8);
            memcpy(h + 8, &meta, 8);
            break;
        }
        }
        memcpy(y - 16, h, 16);
        size_t claimed = (size_t)take(&in, 2);
        dd_alloc_freed_t f = dd_allocation_freed(y, claimed, 0);
        if (f.ptr != y || f.size != claimed) {
            fprintf(stderr, "fuzz_forge: forged header accepted at %p (strategy %d): "
                            "free would hand %p, %zu bytes to the real allocator\n",
                    (void *)y, (how >> 3) & 7, f.ptr, f.size);
            abort();
        }
        CHECK(frees_reported == reported);
    }

    /* The genuine blocks are still recognised, with their raw pointer. */
    for (int i = 0; i < nreal; i++) {
        dd_alloc_freed_t f = dd_allocation_freed(real[i].user, real[i].size, real[i].alignment);
        CHECK(f.ptr == real[i].raw);
        CHECK(f.size >= real[i].size);
    }
    CHECK(frees_reported == reported + (unsigned long)nreal);
    CHECK(ddheap_test_live_marked() == marked_before);
    dd_heap_simulate_tracer(false);
    return 0;
}
