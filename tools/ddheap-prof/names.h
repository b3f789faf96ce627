/*
 * What a frame's symbol means to a user: its demangled name, and whether
 * it is a frame of the allocator itself (ddheap's hooks and wrappers, the
 * malloc family, operator new and delete, allocator internals), which a
 * profile leaves off the top of each stack so that the code that asked for
 * the memory is on top.
 */
#ifndef DDHEAP_PROF_NAMES_H
#define DDHEAP_PROF_NAMES_H

#include <stdbool.h>

/* The demangled form of a C++ (Itanium ABI) symbol, malloc'ed; NULL if
 * the name is not a mangled one (a C name, "[unknown]") or out of memory. */
char *dd_prof_demangle(const char *system_name);

/* True for a symbol (as the object names it: mangled, no version suffix)
 * of the allocator: ddheap_*, dd_*, the malloc family and its glibc
 * aliases, operator new/delete in every form, and the internals of glibc
 * malloc, jemalloc, tcmalloc and mimalloc. */
bool dd_prof_is_allocator_frame(const char *system_name);

#endif
