/*
 * The main() of a cmocka test program that only runs its list of cases:
 *
 *     DDHEAP_TEST_MAIN(cmocka_unit_test(test_one), cmocka_unit_test(test_two))
 */
#ifndef DDHEAP_TEST_MAIN_H
#define DDHEAP_TEST_MAIN_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#define DDHEAP_TEST_MAIN(...)                                                                      \
    int main(void)                                                                                 \
    {                                                                                              \
        const struct CMUnitTest tests[] = {__VA_ARGS__};                                           \
        return cmocka_run_group_tests(tests, NULL, NULL);                                          \
    }

#endif /* DDHEAP_TEST_MAIN_H */
