/*
 * Where the BPF walk of CPython's frames (python.bpf.h) finds what it
 * reads, for one interpreter in one process: filled by the user side
 * (python.c) from a table per minor version (3.10-3.12) or from the
 * interpreter's own _Py_DebugOffsets (3.13), and checked there against
 * the interpreter's own member table of PyCode_Type. Shared by both sides:
 * fixed-width fields only.
 */
#ifndef DDHEAP_PROF_PYTHON_LAYOUT_H
#define DDHEAP_PROF_PYTHON_LAYOUT_H

/* An offset that a version does not have. */
#define DD_PROF_PY_NONE 0xffff

/* The frame and code object are read in one piece each: every offset of
 * a field the walk reads there is below these (checked by the user side). */
#define DD_PROF_PY_FRAME_READ 0x70
#define DD_PROF_PY_CODE_READ 0x98

/* 3.12+: a frame owned by the C stack, the shim _PyEval_EvalFrameDefault
 * puts below the first Python frame it runs (FRAME_OWNED_BY_CSTACK). */
#define DD_PROF_PY_OWNED_BY_CSTACK 3

struct dd_prof_py_layout {
    __u64 runtime;   /* &_PyRuntime in the process */
    __u64 code_type; /* &PyCode_Type in the process */
    __u32 version;   /* PY_VERSION_HEX, major and minor only (0x030b0000) */
    /* _PyRuntime.interpreters.head; PyInterpreterState's list of threads. */
    __u16 runtime_interp_head, interp_threads_head;
    /* PyThreadState: next; the thread's id (see thread_is_pthread); the
     * current frame, or (cframe_frame != NONE) the CFrame holding it. */
    __u16 tstate_next, tstate_thread, tstate_frame, cframe_frame;
    /* The frame (_PyInterpreterFrame, or PyFrameObject in 3.10): its code
     * object, the frame it was called from, the instruction (a pointer,
     * or with instr_is_index an int count of code units), 3.11's
     * is_entry and 3.11+'s owner (bytes; NONE where absent). */
    __u16 frame_code, frame_previous, frame_instr, frame_entry, frame_owner;
    /* PyCodeObject: the fields the fingerprint is made of, and where its
     * instructions start (3.11+: co_code_adaptive). */
    __u16 code_argcount, code_firstlineno, code_name, code_linetable, code_adaptive;
    /* The thread id is pthread_self() (3.10: thread_id, the thread
     * pointer), not the kernel's thread id (3.11+: native_thread_id). */
    __u8 thread_is_pthread;
    __u8 instr_is_index;
    /* Each eval call runs one Python frame (3.10): every frame is an entry. */
    __u8 every_frame_entry;
    __u8 pad;
};

/* The fingerprint of a code object the walk records beside its address,
 * from fields fixed at its creation: the user side recomputes it from
 * what it reads at that address, so a code object freed and another
 * allocated at the same address are never taken for one another. */
static inline __u32 dd_prof_py_check(__u64 name, __u64 linetable, __u32 argcount)
{
    __u32 h = (__u32)(name >> 4) * 0x9e3779b1u;
    h ^= (__u32)(linetable >> 4) * 0x85ebca6bu;
    return h ^ argcount;
}

#endif
