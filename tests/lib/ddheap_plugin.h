/*
 * What tests/lib/ddheap_plugin.c exports: a shared library with its own
 * copy of ddheap, for the tests about several copies in one process.
 */
#ifndef DDHEAP_TEST_PLUGIN_H
#define DDHEAP_TEST_PLUGIN_H

#include <ddheap/testing.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* libc's malloc and free wired through the plugin's copy */
void *ddheap_plugin_malloc(size_t size);
void ddheap_plugin_free(void *ptr);
/* the plugin copy's free gate, simulated tracer and probe hook, and its
 * count of marked blocks */
uint8_t ddheap_plugin_gate(void);
void ddheap_plugin_trace(bool on, dd_probe_hook_fn hook);
uint64_t ddheap_plugin_live(void);
/* the plugin copy's rate-limit API, and a burst of 16 KiB samples */
uint64_t ddheap_plugin_limit(void);
void ddheap_plugin_set_limit(uint64_t samples_per_second);
void ddheap_plugin_set_interval(uint64_t bytes);
uint64_t ddheap_plugin_effective(void);
uint64_t ddheap_plugin_sample_burst(uint64_t blocks);
/* -DDDHEAP_PLUGIN_EXAMPLE_LIBC only: `count` kept blocks of 1000 bytes from
 * the call site site_plugin_blocks, through the example libc wrapper */
void *ddheap_plugin_work(unsigned count);

#endif /* DDHEAP_TEST_PLUGIN_H */
