/*
 * A function with a .cold part for tests/prof/test_interp.c: GCC (-O2)
 * moves each branch that leads to a cold function into
 * "dd_cold_fixture_sum.cold", reached by jumps from the hot part, as it
 * does with CPython's eval loop. Built unstripped: its symbol table names
 * the cold part, the truth the search from the jumps is compared with.
 */
#include <stdio.h>
#include <stdlib.h>

__attribute__((cold, noinline)) static void fail_at(int where, int value)
{
    fprintf(stderr, "cold_fixture: %d at %d\n", value, where);
    exit(2);
}

#define CHECK(k)                                                                                   \
    if (x[k] == -(k)-1)                                                                            \
        fail_at(k, x[k]);                                                                          \
    sum += x[k] * (k + 1);

int dd_cold_fixture_sum(const int *x);

__attribute__((noinline)) int dd_cold_fixture_sum(const int *x)
{
    int sum = 0;
    CHECK(0) CHECK(1) CHECK(2) CHECK(3) CHECK(4) CHECK(5) CHECK(6) CHECK(7)
    CHECK(8) CHECK(9) CHECK(10) CHECK(11) CHECK(12) CHECK(13) CHECK(14) CHECK(15)
    CHECK(16) CHECK(17) CHECK(18) CHECK(19) CHECK(20) CHECK(21) CHECK(22) CHECK(23)
    return sum;
}

int main(int argc, char **argv)
{
    int x[24];
    for (int i = 0; i < 24; i++)
        x[i] = argc + i;
    (void)argv;
    return dd_cold_fixture_sum(x) == 0;
}
