/*
 * Pointer-tag marking (aarch64 with -Dmarking=tbi, the default there).
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

bool ddheap_tbi_thread_ready_slow(struct ddheap__thread *t)
{
    if (t->tagging == DDHEAP_TAGGING_UNTRIED || t->tagging == DDHEAP_TAGGING_FAIL_NEXT)
        t->tagging = request_tagged_addresses(t);
    return t->tagging == DDHEAP_TAGGING_ON;
}

void *ddheap_mark_at(void *raw, uint32_t offset, size_t extra, bool reported)
{
    return ddheap_tbi_tag(raw, offset, extra, reported);
}

bool ddheap_mark_lookup(void *user, struct ddheap_mark *out)
{
    return ddheap_tbi_lookup(user, out);
}

bool ddheap_unmark(void *user, struct ddheap_mark *out)
{
    return ddheap_unmark_quick(user, out) > 0;
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

#endif /* DDHEAP_MARK_TBI */
