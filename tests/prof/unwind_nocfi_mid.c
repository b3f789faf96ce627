/*
 * The middle frame of test_unwind.py's c-nocfi test: built with frame
 * pointers but without unwind tables (-fno-asynchronous-unwind-tables
 * -fno-unwind-tables), so it has no CFI: an unwinder gets past it only by
 * its frame pointer.
 */
void nocfi_site(int n);
void nocfi_middle(int n);

__attribute__((noinline)) void nocfi_middle(int n)
{
    nocfi_site(n);
    /* Not a tail call: the frame stays on the stack during the call. */
    __asm__ volatile("" ::: "memory");
}
