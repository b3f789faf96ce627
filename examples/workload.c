/*
 * A multi-threaded workload for ddheap's example allocators, and the ground
 * truth a tracer's view of it is checked against (tests/tracer, scripts/demo).
 *
 * Each worker thread repeats a round of six call sites. Every site is a
 * function of its own that calls one allocator directly, so a stack taken
 * at the probe names the site one frame above the allocator:
 *
 *   site_request_buffers  libc malloc, freed within the round (the most bytes)
 *   site_grow_log         libc malloc + realloc doubling, freed
 *   site_cache_pages      libc calloc, one in four kept
 *   site_aligned_tiles    posix_memalign / aligned_alloc, freed (sized)
 *   site_pre_attach       (--pre) libc and slab, before any tracer, kept
 *   site_session_objects  slab, one in three kept
 *   site_index_nodes      slab, one in eight kept
 *
 * Every block is filled with a pattern when allocated (realloc: the new
 * part) and checked, all of it, before it is freed; kept blocks are checked
 * and freed at the end when --hold is given. A realloc counts as an
 * allocation of its new size, the convention ddheap reports it with.
 *
 * Synchronisation, so a test never depends on timing:
 *   --go            read one line from stdin before the traced phase
 *   --require-attached  fail unless a tracer is attached when it starts
 *   --seed=N        fix each worker's sampling generator (N + worker index)
 *   --hold=detach   after the truth is printed, keep the kept blocks until
 *                   no tracer is attached (polls dd_heap_profiler_attached),
 *                   then check and free everything
 *   --hold=stdin    the same, but wait for a line on stdin
 *   --linger=detach|stdin  after the truth (and --hold's frees), wait again,
 *                   then exit with whatever is still kept live; worker
 *                   threads stay alive until then (bpftrace symbolises
 *                   stacks through the live threads: it must print first)
 *   --pre=N         before --go, allocate N blocks (kept until the end)
 *
 * Output: progress lines start with "workload:"; the truth (stdout, or the
 * file given with --truth) has one record per line:
 *   site NAME alloc_bytes B alloc_count N live_bytes B live_count N
 *   size NAME SIZE alloc_count N live_count N
 *   total alloc_bytes B live_bytes B
 *   check attached_at_start A marked_max M
 */
#define _GNU_SOURCE

#include <dd_example_libc.h>
#include <dd_slab.h>
#include <ddheap.h>
#include <ddheap/testing.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* A site must keep its own frame: no inlining, no cloning under another
 * name, and the allocator call must not become a tail call (the build
 * adds -fno-optimize-sibling-calls; each site also uses the block after
 * the call). */
#if defined(__clang__)
#define SITE __attribute__((noinline))
#else
#define SITE __attribute__((noinline, noclone))
#endif

enum site_id {
    SITE_REQUEST_BUFFERS,
    SITE_GROW_LOG,
    SITE_CACHE_PAGES,
    SITE_ALIGNED_TILES,
    SITE_SESSION_OBJECTS,
    SITE_INDEX_NODES,
    SITE_PRE_ATTACH, /* --pre blocks: allocated before any tracer */
    SITE_COUNT
};

static const char *const site_names[SITE_COUNT] = {
    "site_request_buffers", "site_grow_log",    "site_cache_pages", "site_aligned_tiles",
    "site_session_objects", "site_index_nodes", "site_pre_attach",
};

/* How a kept block must be freed. */
enum release_kind { REL_LIBC, REL_LIBC_SIZED, REL_ALIGNED_SIZED, REL_SLAB };

/* Sizes per site. Few distinct sizes keep the per-size truth short. */
static const size_t request_sizes[] = {64, 128, 256, 512, 1024, 2048, 4096, 8192};
static const size_t cache_sizes[] = {4096, 8192};
static const size_t session_sizes[] = {1000, 2000, 3000, 4080};
static const size_t index_sizes[] = {24, 40, 72, 136};
#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))
#define MAX_SIZES 16

struct kept {
    void *ptr;
    size_t size;
    size_t alignment;
    uint8_t site;
    uint8_t kind;
    uint8_t tag;
};

/* Per-thread ground truth. */
struct tally {
    uint64_t alloc_bytes[SITE_COUNT];
    uint64_t alloc_count[SITE_COUNT];
    size_t sizes[SITE_COUNT][MAX_SIZES];
    uint64_t size_allocs[SITE_COUNT][MAX_SIZES];
    uint64_t size_live[SITE_COUNT][MAX_SIZES];
};

struct worker {
    pthread_t thread;
    unsigned index;
    struct tally tally;
    struct kept *kept;
    size_t kept_len, kept_cap;
    unsigned round;      /* rounds done so far */
    uint64_t serial;     /* drives the fill pattern */
    uint64_t marked_max; /* most marked blocks seen live at a round's end */
    unsigned long corrupt;
};

static struct {
    unsigned threads;
    unsigned rounds;
    unsigned pre;
    bool go;
    bool require_attached;
    const char *linger; /* NULL, "detach" or "stdin" */
    bool seeded;
    uint64_t seed;
    const char *hold; /* NULL, "detach" or "stdin" */
    const char *truth_path;
    unsigned timeout_s;
} opt = {2, 200, 0, false, false, NULL, false, 0, NULL, NULL, 120};

static void fail(int code, const char *what)
{
    fprintf(stderr, "workload: %s\n", what);
    exit(code);
}

static void record(struct worker *w, enum site_id site, size_t size, bool kept)
{
    struct tally *t = &w->tally;
    t->alloc_bytes[site] += size;
    t->alloc_count[site]++;
    for (size_t i = 0; i < MAX_SIZES; i++) {
        if (t->sizes[site][i] == size || t->sizes[site][i] == 0) {
            t->sizes[site][i] = size;
            t->size_allocs[site][i]++;
            t->size_live[site][i] += kept;
            return;
        }
    }
    fail(2, "too many distinct sizes at one site");
}

/* The pattern byte of a block: differs between neighbours, so a block
 * overwritten by its neighbour's fill (or by a stray header) is caught. */
static uint8_t next_tag(struct worker *w)
{
    w->serial++;
    return (uint8_t)(w->serial * 151 + w->index * 17 + 1);
}

static void fill(void *p, size_t from, size_t to, uint8_t tag)
{
    memset((char *)p + from, tag, to - from);
}

static bool intact(const void *p, size_t size, uint8_t tag)
{
    const unsigned char *b = p;
    uint64_t word = UINT64_C(0x0101010101010101) * tag;
    size_t i = 0;
    for (; i + 8 <= size; i += 8) {
        uint64_t v;
        memcpy(&v, b + i, 8);
        if (v != word)
            return false;
    }
    for (; i < size; i++)
        if (b[i] != tag)
            return false;
    return true;
}

static void check(struct worker *w, const void *p, size_t size, uint8_t tag)
{
    if (!intact(p, size, tag))
        w->corrupt++;
}

static void keep(struct worker *w, void *p, size_t size, size_t alignment, enum site_id site,
                 enum release_kind kind, uint8_t tag)
{
    if (w->kept_len == w->kept_cap) {
        /* Plain realloc: the workload's own bookkeeping is not part of the
         * truth and must not show up in the profile. */
        w->kept_cap = w->kept_cap ? 2 * w->kept_cap : 1024;
        w->kept = realloc(w->kept, w->kept_cap * sizeof *w->kept);
        if (w->kept == NULL)
            fail(2, "out of memory for bookkeeping");
    }
    w->kept[w->kept_len++] = (struct kept){p, size, alignment, (uint8_t)site, (uint8_t)kind, tag};
}

static void release(struct worker *w, const struct kept *k)
{
    check(w, k->ptr, k->size, k->tag);
    switch ((enum release_kind)k->kind) {
    case REL_LIBC: dd_example_free(k->ptr); break;
    case REL_LIBC_SIZED: dd_example_free_sized(k->ptr, k->size); break;
    case REL_ALIGNED_SIZED: dd_example_free_aligned_sized(k->ptr, k->alignment, k->size); break;
    case REL_SLAB: dd_slab_free(k->ptr, k->size); break;
    }
}

static void *must(void *p)
{
    if (p == NULL)
        fail(2, "allocation failed");
    return p;
}

/* --- the call sites --------------------------------------------------- */

/* Short-lived request buffers: the site with the most bytes. */
SITE static void site_request_buffers(struct worker *w)
{
    void *blocks[24];
    size_t sizes[24];
    uint8_t tags[24];
    for (unsigned i = 0; i < 24; i++) {
        sizes[i] = request_sizes[i % COUNT_OF(request_sizes)];
        tags[i] = next_tag(w);
        blocks[i] = must(dd_example_malloc(sizes[i]));
        fill(blocks[i], 0, sizes[i], tags[i]);
        record(w, SITE_REQUEST_BUFFERS, sizes[i], false);
    }
    for (unsigned i = 0; i < 24; i++) {
        check(w, blocks[i], sizes[i], tags[i]);
        dd_example_free(blocks[i]);
    }
}

/* A log buffer grown by doubling from 256 bytes to 16 KiB. */
SITE static void site_grow_log(struct worker *w)
{
    size_t size = 256;
    uint8_t tag = next_tag(w);
    char *log = must(dd_example_malloc(size));
    fill(log, 0, size, tag);
    record(w, SITE_GROW_LOG, size, false);
    while (size < 16384) {
        size_t grown = 2 * size;
        log = must(dd_example_realloc(log, grown));
        check(w, log, size, tag); /* realloc kept the old bytes */
        fill(log, size, grown, tag);
        record(w, SITE_GROW_LOG, grown, false);
        size = grown;
    }
    check(w, log, size, tag);
    dd_example_free_sized(log, size);
}

/* Zeroed cache pages, one in four kept for the life of the program. */
SITE static void site_cache_pages(struct worker *w)
{
    for (unsigned i = 0; i < 4; i++) {
        size_t size = cache_sizes[i % COUNT_OF(cache_sizes)];
        unsigned char *page = must(dd_example_calloc(size / 8, 8));
        if (page[0] != 0 || page[size / 2] != 0 || page[size - 1] != 0 || !intact(page, size, 0))
            w->corrupt++;
        uint8_t tag = next_tag(w);
        fill(page, 0, size, tag);
        bool kept = i == 0;
        record(w, SITE_CACHE_PAGES, size, kept);
        if (kept) {
            keep(w, page, size, 0, SITE_CACHE_PAGES, REL_LIBC_SIZED, tag);
        } else {
            check(w, page, size, tag);
            dd_example_free_sized(page, size);
        }
    }
}

/* Page-aligned tiles and cache-line aligned rows, freed with their size
 * and alignment. */
SITE static void site_aligned_tiles(struct worker *w)
{
    void *tile = NULL;
    if (dd_example_posix_memalign(&tile, 4096, 16384) != 0)
        fail(2, "posix_memalign failed");
    if ((uintptr_t)tile % 4096 != 0)
        w->corrupt++;
    uint8_t tile_tag = next_tag(w);
    fill(tile, 0, 16384, tile_tag);
    record(w, SITE_ALIGNED_TILES, 16384, false);

    void *row = must(dd_example_aligned_alloc(64, 3000));
    if ((uintptr_t)row % 64 != 0)
        w->corrupt++;
    uint8_t row_tag = next_tag(w);
    fill(row, 0, 3000, row_tag);
    record(w, SITE_ALIGNED_TILES, 3000, false);

    check(w, row, 3000, row_tag);
    dd_example_free_aligned_sized(row, 64, 3000);
    check(w, tile, 16384, tile_tag);
    dd_example_free_aligned_sized(tile, 4096, 16384);
}

/* Session objects from the slab, one in three kept. */
SITE static void site_session_objects(struct worker *w)
{
    for (unsigned i = 0; i < 3; i++) {
        size_t size = session_sizes[(i + w->round) % COUNT_OF(session_sizes)];
        void *obj = must(dd_slab_alloc(size));
        uint8_t tag = next_tag(w);
        fill(obj, 0, size, tag);
        bool kept = i == 0;
        record(w, SITE_SESSION_OBJECTS, size, kept);
        if (kept) {
            keep(w, obj, size, 0, SITE_SESSION_OBJECTS, REL_SLAB, tag);
        } else {
            check(w, obj, size, tag);
            dd_slab_free(obj, size);
        }
    }
}

/* Small index nodes from the slab, packed back to back, one in eight kept. */
SITE static void site_index_nodes(struct worker *w)
{
    void *nodes[16];
    uint8_t tags[16];
    size_t sizes[16];
    for (unsigned i = 0; i < 16; i++) {
        sizes[i] = index_sizes[i % COUNT_OF(index_sizes)];
        nodes[i] = must(dd_slab_alloc(sizes[i]));
        tags[i] = next_tag(w);
        fill(nodes[i], 0, sizes[i], tags[i]);
        record(w, SITE_INDEX_NODES, sizes[i], i % 8 == 0);
    }
    for (unsigned i = 0; i < 16; i++) {
        if (i % 8 == 0) {
            keep(w, nodes[i], sizes[i], 0, SITE_INDEX_NODES, REL_SLAB, tags[i]);
        } else {
            check(w, nodes[i], sizes[i], tags[i]);
            dd_slab_free(nodes[i], sizes[i]);
        }
    }
}

/* Blocks allocated before any tracer is attached, kept to the end: their
 * frees must pass through untouched whatever happens in between. */
SITE static void site_pre_attach(struct worker *w, unsigned count)
{
    for (unsigned i = 0; i < count; i++) {
        size_t size = index_sizes[i % COUNT_OF(index_sizes)];
        uint8_t tag = next_tag(w);
        bool slab = i % 2 == 0;
        void *p = must(slab ? dd_slab_alloc(size) : dd_example_malloc(size));
        fill(p, 0, size, tag);
        keep(w, p, size, 0, SITE_PRE_ATTACH, slab ? REL_SLAB : REL_LIBC, tag);
    }
}

/* --- threads and phases ----------------------------------------------- */

static void worker_round(struct worker *w)
{
    site_request_buffers(w);
    site_grow_log(w);
    site_cache_pages(w);
    site_aligned_tiles(w);
    site_session_objects(w);
    site_index_nodes(w);
}

/* Workers stay alive until main lets them go: bpftrace 0.17 symbolises a
 * stack only when it prints it, through /proc/<tid> of the thread that
 * took it, so a thread that has exited by then leaves raw addresses. */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t changed;
    unsigned finished;
    bool released;
} gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, false};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    if (opt.seeded)
        ddheap_test_seed_thread(opt.seed + w->index);
    for (w->round = 0; w->round < opt.rounds; w->round++) {
        worker_round(w);
        uint64_t marked = ddheap_test_live_marked();
        if (marked > w->marked_max)
            w->marked_max = marked;
    }
    pthread_mutex_lock(&gate.lock);
    gate.finished++;
    pthread_cond_broadcast(&gate.changed);
    while (!gate.released)
        pthread_cond_wait(&gate.changed, &gate.lock);
    pthread_mutex_unlock(&gate.lock);
    return NULL;
}

static void wait_workers_finished(void)
{
    pthread_mutex_lock(&gate.lock);
    while (gate.finished < opt.threads)
        pthread_cond_wait(&gate.changed, &gate.lock);
    pthread_mutex_unlock(&gate.lock);
}

static void release_workers(struct worker *workers)
{
    pthread_mutex_lock(&gate.lock);
    gate.released = true;
    pthread_cond_broadcast(&gate.changed);
    pthread_mutex_unlock(&gate.lock);
    for (unsigned t = 0; t < opt.threads; t++)
        pthread_join(workers[t].thread, NULL);
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void wait_line(const char *why)
{
    char line[64];
    if (fgets(line, sizeof line, stdin) == NULL)
        fail(3, why);
}

/* Waits until no tracer is attached, the tracer's own way of saying "I
 * have printed what I saw and detached". */
static void wait_detached(void)
{
    for (unsigned waited = 0; dd_heap_profiler_attached(); waited += 10) {
        if (waited >= opt.timeout_s * 1000u)
            fail(3, "timed out waiting for the tracer to detach");
        sleep_ms(10);
    }
}

static void wait_for(const char *mode)
{
    if (strcmp(mode, "stdin") == 0)
        wait_line("stdin closed before the release line");
    else
        wait_detached();
}

static void print_truth(FILE *out, struct worker *workers, uint64_t marked_max,
                        bool attached_at_start)
{
    struct tally sum;
    memset(&sum, 0, sizeof sum);
    for (unsigned t = 0; t < opt.threads; t++) {
        const struct tally *x = &workers[t].tally;
        for (unsigned s = 0; s < SITE_COUNT; s++) {
            sum.alloc_bytes[s] += x->alloc_bytes[s];
            sum.alloc_count[s] += x->alloc_count[s];
            for (unsigned i = 0; i < MAX_SIZES && x->sizes[s][i]; i++) {
                unsigned j = 0;
                while (sum.sizes[s][j] != 0 && sum.sizes[s][j] != x->sizes[s][i])
                    j++;
                sum.sizes[s][j] = x->sizes[s][i];
                sum.size_allocs[s][j] += x->size_allocs[s][i];
                sum.size_live[s][j] += x->size_live[s][i];
            }
        }
    }
    uint64_t total_alloc = 0, total_live = 0;
    for (unsigned s = 0; s < SITE_PRE_ATTACH; s++) {
        uint64_t live_bytes = 0, live_count = 0;
        for (unsigned i = 0; i < MAX_SIZES && sum.sizes[s][i]; i++) {
            live_bytes += sum.sizes[s][i] * sum.size_live[s][i];
            live_count += sum.size_live[s][i];
        }
        fprintf(out, "site %s alloc_bytes %" PRIu64 " alloc_count %" PRIu64 " live_bytes %" PRIu64
                     " live_count %" PRIu64 "\n",
                site_names[s], sum.alloc_bytes[s], sum.alloc_count[s], live_bytes, live_count);
        for (unsigned i = 0; i < MAX_SIZES && sum.sizes[s][i]; i++)
            fprintf(out, "size %s %zu alloc_count %" PRIu64 " live_count %" PRIu64 "\n",
                    site_names[s], sum.sizes[s][i], sum.size_allocs[s][i], sum.size_live[s][i]);
        total_alloc += sum.alloc_bytes[s];
        total_live += live_bytes;
    }
    fprintf(out, "total alloc_bytes %" PRIu64 " live_bytes %" PRIu64 "\n", total_alloc,
            total_live);
    fprintf(out, "check attached_at_start %d marked_max %" PRIu64 "\n", attached_at_start,
            marked_max);
    fflush(out);
}

static unsigned parse_uint(const char *text, const char *name)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(text, &end, 10);
    if (errno || *end || end == text || v > 1000000000ul) {
        fprintf(stderr, "workload: bad value for %s: %s\n", name, text);
        exit(2);
    }
    return (unsigned)v;
}

static void usage(void)
{
    fputs("usage: workload [--threads=N] [--rounds=N] [--seed=N] [--pre=N] [--go]\n"
          "                [--require-attached] [--hold=detach|stdin]\n"
          "                [--linger=detach|stdin]\n"
          "                [--truth=FILE] [--timeout=SECONDS]\n",
          stderr);
    exit(2);
}

static void parse_args(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *eq = strchr(a, '=');
        const char *v = eq ? eq + 1 : "";
        size_t n = eq ? (size_t)(eq - a) : strlen(a);
#define IS(name) (n == strlen(name) && strncmp(a, name, n) == 0)
        if (IS("--threads") && eq)
            opt.threads = parse_uint(v, "--threads");
        else if (IS("--rounds") && eq)
            opt.rounds = parse_uint(v, "--rounds");
        else if (IS("--pre") && eq)
            opt.pre = parse_uint(v, "--pre");
        else if (IS("--seed") && eq)
            opt.seed = parse_uint(v, "--seed"), opt.seeded = true;
        else if (IS("--timeout") && eq)
            opt.timeout_s = parse_uint(v, "--timeout");
        else if (IS("--truth") && eq)
            opt.truth_path = v;
        else if (IS("--hold") && eq && (strcmp(v, "detach") == 0 || strcmp(v, "stdin") == 0))
            opt.hold = v;
        else if (IS("--go") && !eq)
            opt.go = true;
        else if (IS("--require-attached") && !eq)
            opt.require_attached = true;
        else if (IS("--linger") && eq && (strcmp(v, "detach") == 0 || strcmp(v, "stdin") == 0))
            opt.linger = v;
        else
            usage();
#undef IS
    }
    if (opt.threads == 0 || opt.threads > 64)
        fail(2, "--threads must be 1..64");
}

int main(int argc, char **argv)
{
    parse_args(argc, argv);
    setvbuf(stdout, NULL, _IOLBF, 0);

    /* Kept in a global so that blocks still kept at exit (--linger) stay
     * reachable: LeakSanitizer reports only unreachable memory. */
    static struct worker *workers;
    workers = calloc(opt.threads, sizeof *workers);
    if (workers == NULL)
        fail(2, "out of memory");
    for (unsigned t = 0; t < opt.threads; t++)
        workers[t].index = t;

    /* Before any tracer: kept by worker 0, freed (if at all) at the end. */
    site_pre_attach(&workers[0], opt.pre);

    printf("workload: pid=%d ready\n", (int)getpid());
    if (opt.go)
        wait_line("stdin closed before the go line");
    bool attached = dd_heap_profiler_attached();
    if (opt.require_attached && !attached)
        fail(3, "--require-attached: no tracer is attached");

    for (unsigned t = 0; t < opt.threads; t++)
        if (pthread_create(&workers[t].thread, NULL, worker_main, &workers[t]) != 0)
            fail(2, "pthread_create failed");
    uint64_t marked_max = 0;
    unsigned long corrupt = 0;
    wait_workers_finished();
    for (unsigned t = 0; t < opt.threads; t++) {
        if (workers[t].marked_max > marked_max)
            marked_max = workers[t].marked_max;
        corrupt += workers[t].corrupt;
    }

    FILE *truth = stdout;
    if (opt.truth_path && (truth = fopen(opt.truth_path, "w")) == NULL)
        fail(2, "cannot open the --truth file");
    print_truth(truth, workers, marked_max, attached);
    if (truth != stdout)
        fclose(truth);
    printf("workload: done corrupt=%lu\n", corrupt);

    if (opt.hold) {
        printf("workload: holding marked=%" PRIu64 "\n", ddheap_test_live_marked());
        wait_for(opt.hold);
        /* Free everything, the pre-attach blocks included, checking every
         * byte: blocks sampled while the tracer was attached must still be
         * recognised and released to their real allocator. */
        for (unsigned t = 0; t < opt.threads; t++) {
            struct worker *w = &workers[t];
            w->corrupt = 0; /* already counted above */
            for (size_t i = 0; i < w->kept_len; i++)
                release(w, &w->kept[i]);
            corrupt += w->corrupt;
            w->kept_len = 0;
        }
        printf("workload: freed marked=%" PRIu64 " corrupt=%lu attached=%d\n",
               ddheap_test_live_marked(), corrupt, dd_heap_profiler_attached());
    }
    if (opt.linger) {
        printf("workload: lingering marked=%" PRIu64 "\n", ddheap_test_live_marked());
        wait_for(opt.linger);
    }
    release_workers(workers);
    printf("workload: exit\n");
    return corrupt ? 4 : 0;
}
