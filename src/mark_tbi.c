/*
 * Pointer-tag marking (aarch64 with -Darm64_marking=tbi, the default there).
 *
 * A sampled block's user pointer is its raw pointer with DDHEAP__TAG (0xDD)
 * in bits 56..63. Top-Byte-Ignore makes the CPU drop those bits on every
 * load and store, so the application uses the pointer unchanged; the free
 * path recognises a mark with one shift and compare (ddheap/fastpath.h),
 * reads no memory, and gets the raw pointer back by clearing the byte. No
 * bytes are added to the request (extra = 0, offset = 0): sized frees need
 * no correction and every alignment is marked the same way.
 *
 * The CPU ignores the top byte, the kernel does not: a syscall given a
 * tagged buffer fails with EFAULT unless the calling thread opted in with
 * prctl(PR_SET_TAGGED_ADDR_CTRL, PR_TAGGED_ADDR_ENABLE). That setting is
 * per thread, inherited by the threads and processes it creates later, and
 * cleared by execve. So:
 *  - each thread asks once, at its first sampling opportunity, and keeps
 *    the answer in t->tagging; a thread the kernel refuses never samples
 *    (its frees still untag whatever other threads sampled);
 *  - ddheap_process_init() asks on the thread that loads the library as
 *    well, before main() in the usual case, so every thread the program
 *    creates afterwards inherits the setting. Without that, a tagged block
 *    handed to a thread that never allocated while a tracer was attached
 *    (an I/O thread writing buffers others filled) would make its write(2)
 *    fail. Threads that already existed when ddheap was loaded (dlopen) do
 *    not inherit it: docs/arm64.md says when to pick the header scheme.
 *
 * Where our tag cannot be used, the thread does not sample:
 *  - MTE tag checking on (PR_MTE_TCF_SYNC/ASYNC): bits 56..59 are then the
 *    memory tag the hardware checks, and 0xD there would fault;
 *  - a raw pointer whose top byte is already set (HWASan, MTE allocators):
 *    mark_at refuses it and the block passes through unsampled.
 * The request keeps the other bits of the thread's control word (the MTE
 * tag mask, etc.) instead of overwriting them with PR_TAGGED_ADDR_ENABLE
 * alone.
 */
#include "mark.h"

#include <errno.h>
#include <sys/prctl.h>

#if DDHEAP_MARK_TBI

/* struct ddheap__thread.tagging. Zero-initialised TLS reads UNTRIED. */
enum ddheap_tagging {
    DDHEAP_TAGGING_UNTRIED = 0,
    DDHEAP_TAGGING_FAIL_NEXT = 1, /* test hook: the next request fails */
    DDHEAP_TAGGING_ON = 2,
    DDHEAP_TAGGING_REFUSED = 3, /* the kernel said no */
    DDHEAP_TAGGING_MTE = 4,     /* MTE checks on: our tag would fault */
};

#define TAG_SHIFT 56
#define ADDRESS_MASK ((UINT64_C(1) << TAG_SHIFT) - 1)

static uint8_t request_tagged_addresses(const struct ddheap__thread *t)
{
    if (t->tagging == DDHEAP_TAGGING_FAIL_NEXT)
        return DDHEAP_TAGGING_REFUSED;
    int saved_errno = errno;
    uint8_t outcome = DDHEAP_TAGGING_ON;
    /* EINVAL: a kernel without the tagged-address ABI (before 5.4, or
     * CONFIG_ARM64_TAGGED_ADDR_ABI off). */
    int ctrl = prctl(PR_GET_TAGGED_ADDR_CTRL, 0UL, 0UL, 0UL, 0UL);
    if (ctrl < 0)
        outcome = DDHEAP_TAGGING_REFUSED;
    else if ((unsigned long)ctrl & PR_MTE_TCF_MASK)
        outcome = DDHEAP_TAGGING_MTE;
    else if (!((unsigned long)ctrl & PR_TAGGED_ADDR_ENABLE) &&
             /* fails with sysctl abi.tagged_addr_disabled=1 */
             prctl(PR_SET_TAGGED_ADDR_CTRL, (unsigned long)ctrl | PR_TAGGED_ADDR_ENABLE, 0UL,
                   0UL, 0UL) != 0)
        outcome = DDHEAP_TAGGING_REFUSED;
    errno = saved_errno;
    return outcome;
}

void ddheap_tbi_process_init(bool sampling_enabled)
{
    struct ddheap__thread *t = &ddheap__thread_state;
    if (!sampling_enabled) {
        /* Nothing to enable, but prctl still gets bound now: the
         * environment can be read again later (a test hook). */
        int ignored = prctl(PR_GET_TAGGED_ADDR_CTRL, 0UL, 0UL, 0UL, 0UL);
        (void)ignored;
        return;
    }
    if (t->tagging == DDHEAP_TAGGING_UNTRIED)
        t->tagging = request_tagged_addresses(t);
}

bool ddheap_mark_thread_ready(struct ddheap__thread *t)
{
    if (DDHEAP__LIKELY(t->tagging == DDHEAP_TAGGING_ON))
        return true;
    if (t->tagging == DDHEAP_TAGGING_UNTRIED || t->tagging == DDHEAP_TAGGING_FAIL_NEXT)
        t->tagging = request_tagged_addresses(t);
    return t->tagging == DDHEAP_TAGGING_ON;
}

int ddheap_mark_thread_status(const struct ddheap__thread *t)
{
    switch (t->tagging) {
    case DDHEAP_TAGGING_ON:
        return DD_HEAP_THREAD_SAMPLING_READY;
    case DDHEAP_TAGGING_REFUSED:
        return DD_HEAP_THREAD_SAMPLING_NO_TAGGED_ADDR;
    case DDHEAP_TAGGING_MTE:
        return DD_HEAP_THREAD_SAMPLING_MTE;
    default:
        return DD_HEAP_THREAD_SAMPLING_PENDING;
    }
}

void ddheap_test_fail_tagging(bool fail)
{
    ddheap__thread_state.tagging = fail ? DDHEAP_TAGGING_FAIL_NEXT : DDHEAP_TAGGING_UNTRIED;
}

static bool power_of_two(size_t x)
{
    return x != 0 && (x & (x - 1)) == 0;
}

/* Same alignment rule as the header scheme, so that which blocks can be
 * sampled does not depend on the marking scheme; the tag itself needs no
 * room at any alignment. */
size_t ddheap_mark_extra(size_t alignment)
{
    if (alignment != 0 && (!power_of_two(alignment) || alignment > DDHEAP_MAX_SAMPLED_ALIGNMENT))
        return SIZE_MAX;
    return 0;
}

static void count_marked(int delta)
{
    __atomic_add_fetch(&ddheap_shared_v2.live_marked, (uint64_t)(int64_t)delta, __ATOMIC_RELAXED);
}

void *ddheap_mark_at(void *raw, uint32_t offset, size_t extra, bool reported)
{
    uint64_t address = (uintptr_t)raw;
    /* A tag carries one bit of information: "sampled and reported". It has
     * no room for an offset or extra bytes (mark_extra never asks for any),
     * and the top byte must be ours to set. */
    if (offset != 0 || extra != 0 || !reported || (address >> TAG_SHIFT) != 0)
        return NULL;
    count_marked(1);
    return (void *)(uintptr_t)(address | ((uint64_t)DDHEAP__TAG << TAG_SHIFT));
}

bool ddheap_mark_lookup(void *user, struct ddheap_mark *out)
{
    uint64_t address = (uintptr_t)user;
    if ((address >> TAG_SHIFT) != DDHEAP__TAG)
        return false;
    out->raw = (void *)(uintptr_t)(address & ADDRESS_MASK);
    out->extra = 0;
    out->offset = 0;
    out->reported = true;
    return true;
}

/* The tag lives in the pointer the application holds, so there is nothing
 * to erase: once the raw block is freed, whatever reuses the address gets
 * an untagged pointer from the real allocator. */
bool ddheap_unmark(void *user, struct ddheap_mark *out)
{
    if (!ddheap_mark_lookup(user, out))
        return false;
    count_marked(-1);
    return true;
}

#endif /* DDHEAP_MARK_TBI */
