/* ddheap-prof's frame names (tools/ddheap-prof/names.c): which symbols are
 * the allocator's own, left off the top of every stack, and demangling. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "names.h"

static void allocator_frames_are_recognised(void **state)
{
    (void)state;
    static const char *const allocator[] = {
        /* ddheap's own: hooks, the probe's function, the preload wrappers */
        "ddheap_fire_alloc", "ddheap__alloc_slow", "ddheap_libc_malloc", "ddheap_libc_realloc",
        "dd_allocation_sampled", "dd_heap_interpose_libc",
        /* the malloc family */
        "malloc", "calloc", "realloc", "free", "posix_memalign", "aligned_alloc", "memalign",
        "valloc", "pvalloc", "reallocarray", "__libc_malloc", "__libc_calloc", "_int_malloc",
        /* operator new and delete, every form */
        "_Znwm", "_Znam", "_ZnwmSt11align_val_t", "_ZnamSt11align_val_t", "_ZnwmRKSt9nothrow_t",
        "_ZnamRKSt9nothrow_t", "_ZnwmSt11align_val_tRKSt9nothrow_t", "_ZdlPv", "_ZdlPvm",
        "_ZdaPv", "_ZdlPvSt11align_val_t",
        /* jemalloc, tcmalloc, mimalloc */
        "je_malloc_default", "imalloc_body", "tc_malloc", "tc_new", "mi_malloc", "_mi_malloc_generic",
    };
    for (size_t i = 0; i < sizeof allocator / sizeof *allocator; i++) {
        if (!dd_prof_is_allocator_frame(allocator[i]))
            fail_msg("%s is the allocator's frame", allocator[i]);
    }
}

static void user_frames_are_kept(void **state)
{
    (void)state;
    static const char *const user[] = {
        "main", "make_records", "_Z12make_recordsi", "site_request_buffers", "mallocate",
        "freelist_push", "my_malloc_wrapper", "_ZN12_GLOBAL__N_14workEv", "strdup",
        "PyMem_Malloc", "_PyObject_Malloc", "sqlite3MemMalloc", "[unknown]", "[truncated]",
        "_ZNSt6vectorIiSaIiEE17_M_realloc_insertIJRKiEEEvN9__gnu_cxx17__normal_iteratorIPiS1_EEDpOT_",
    };
    for (size_t i = 0; i < sizeof user / sizeof *user; i++) {
        if (dd_prof_is_allocator_frame(user[i]))
            fail_msg("%s is not the allocator's frame", user[i]);
    }
}

static void names_are_demangled(void **state)
{
    (void)state;
    char *s = dd_prof_demangle("_Z12make_recordsi");
    assert_non_null(s);
    assert_string_equal(s, "make_records(int)");
    free(s);
    s = dd_prof_demangle("_Znwm");
    assert_non_null(s);
    assert_string_equal(s, "operator new(unsigned long)");
    free(s);
    assert_null(dd_prof_demangle("main"));
    assert_null(dd_prof_demangle("_Z"));
    assert_null(dd_prof_demangle("[unknown]"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(allocator_frames_are_recognised),
        cmocka_unit_test(user_frames_are_kept),
        cmocka_unit_test(names_are_demangled),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
