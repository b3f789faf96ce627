/*
 * The main() of a cmocka test program that only runs its list of cases:
 *
 *     DDHEAP_TEST_MAIN(cmocka_unit_test(test_one), cmocka_unit_test(test_two))
 *
 * and one case function run with several values, each a case of its own
 * name, the value in *state as an integer:
 *
 *     DDHEAP_CASE_WITH(test_threads, "one thread", 1)
 */
#ifndef DDHEAP_TEST_MAIN_H
#define DDHEAP_TEST_MAIN_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#define DDHEAP_CASE_WITH(test, case_name, value)                                                   \
    {.name = (case_name), .test_func = (test), .initial_state = (void *)(uintptr_t)(value)}
#define DDHEAP_CASE_VALUE(state) ((uintptr_t)*(state))

#define DDHEAP_TEST_MAIN(...)                                                                      \
    int main(void)                                                                                 \
    {                                                                                              \
        const struct CMUnitTest tests[] = {__VA_ARGS__};                                           \
        return cmocka_run_group_tests(tests, NULL, NULL);                                          \
    }

#endif /* DDHEAP_TEST_MAIN_H */
