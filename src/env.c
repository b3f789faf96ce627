/*
 * DD_HEAP_SAMPLING_ENABLED, DD_HEAP_SAMPLING_INTERVAL and
 * DD_HEAP_SAMPLES_PER_SECOND, read once.
 * getenv() allocates nothing; the parsing below is ours (strtoull would
 * consult the locale). A bad value keeps the default and sets a bit of the
 * process-wide status word (below).
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

static bool is_word(const char *text, const char *word)
{
    for (; *word; text++, word++) {
        char c = *text;
        if (c >= 'A' && c <= 'Z')
            c = (char)(c - 'A' + 'a');
        if (c != *word)
            return false;
    }
    return *text == '\0';
}

int ddheap_parse_enabled(const char *text)
{
    static const char *const on[] = {"1", "true", "yes", "on"};
    static const char *const off[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < sizeof on / sizeof on[0]; i++) {
        if (is_word(text, on[i]))
            return 1;
        if (is_word(text, off[i]))
            return 0;
    }
    return -1;
}

/* The decimal digits at the start of `text` (at least one) as a number;
 * *end points past them. False for no digit (empty, sign, space, garbage)
 * and for overflow. */
static bool parse_decimal(const char *text, uint64_t *value, const char **end)
{
    uint64_t v = 0;
    const char *p = text;
    if (*p < '0' || *p > '9')
        return false;
    for (; *p >= '0' && *p <= '9'; p++) {
        uint64_t digit = (uint64_t)(*p - '0');
        if (v > (UINT64_MAX - digit) / 10)
            return false;
        v = v * 10 + digit;
    }
    *value = v;
    *end = p;
    return true;
}

bool ddheap_parse_interval(const char *text, uint64_t *out)
{
    uint64_t value;
    const char *p;
    if (!parse_decimal(text, &value, &p))
        return false;
    unsigned shift = 0;
    switch (*p) {
    case 'k': case 'K': shift = 10; p++; break;
    case 'm': case 'M': shift = 20; p++; break;
    case 'g': case 'G': shift = 30; p++; break;
    default: break;
    }
    if (*p != '\0' || value == 0)
        return false;
    if (shift && value > (UINT64_MAX >> shift))
        return false;
    *out = value << shift;
    return true;
}

bool ddheap_parse_rate(const char *text, uint64_t *out)
{
    uint64_t value;
    const char *p;
    if (!parse_decimal(text, &value, &p) || *p != '\0')
        return false;
    *out = value;
    return true;
}

/* A bad value keeps the default and is recorded in the process-wide status
 * word, never written on the program's stderr: the program, and every
 * process it starts with the same environment, must print exactly what
 * it prints without ddheap. A profiler reads the word (ddheap-prof says
 * which variable was ignored); ddheap-run checks the values before exec. */
static void complain(uint64_t status_bit)
{
    __atomic_fetch_or(&ddheap_shared_v3.status, status_bit, __ATOMIC_RELAXED);
}

struct ddheap_config ddheap_read_environment(void)
{
    struct ddheap_config c = {true, DDHEAP_DEFAULT_INTERVAL, DDHEAP_DEFAULT_SAMPLES_PER_SECOND};
    const char *enabled = getenv("DD_HEAP_SAMPLING_ENABLED");
    if (enabled) {
        int on = ddheap_parse_enabled(enabled);
        if (on < 0)
            complain(DDHEAP__STATUS_BAD_ENABLED); /* sampling stays enabled */
        else
            c.enabled = on == 1;
    }
    const char *interval = getenv("DD_HEAP_SAMPLING_INTERVAL");
    if (interval && !ddheap_parse_interval(interval, &c.interval))
        complain(DDHEAP__STATUS_BAD_INTERVAL); /* 524288 */
    const char *rate = getenv("DD_HEAP_SAMPLES_PER_SECOND");
    if (rate && !ddheap_parse_rate(rate, &c.samples_per_second))
        complain(DDHEAP__STATUS_BAD_RATE); /* the default limit */
    return c;
}
