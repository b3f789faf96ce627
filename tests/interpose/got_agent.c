/* The shape in-process interposition is for: ddheap inside a shared
 * library loaded into a program that knows nothing of it (an agent, a
 * plugin, a Python extension module). This library is only libddheap.a
 * (linked whole) and this file; the GOT test's executable calls the API
 * the archive exports from here. The object that holds ddheap is never
 * rewritten, so the executable's own calls to malloc are. */
#include <ddheap.h>

int dd_got_agent_scheme_is_shadow(void);

int dd_got_agent_scheme_is_shadow(void)
{
    return DDHEAP_MARK_SHADOW;
}
