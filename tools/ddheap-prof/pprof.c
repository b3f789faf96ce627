/*
 * The pprof writer (pprof.h): protobuf-c messages from pprof.proto, packed
 * into one buffer, gzipped with zlib. Sample values follow Go's heap
 * profiles: alloc_objects, alloc_space, inuse_objects, inuse_space; the
 * object counts are estimates (sum of weight / size) rounded to integers.
 *
 * Lifetimes: a stack's allocations are split by what became of them. The
 * blocks freed with a lifetime in [2^k, 2^(k+1)) ns are one sample with
 * the numeric label lifetime = 2^k nanoseconds and only alloc_* values;
 * the rest (still live, or their free not seen) is the sample without a
 * lifetime, with the inuse_* values. The totals per stack are unchanged,
 * and `go tool pprof -sample_index=alloc_space -tags` shows how long the
 * allocated bytes lived.
 *
 * Every sample also carries the numeric label pid, its process (stacks
 * are per process, table.h): `-tagfocus=pid=N` keeps one; and the string
 * labels comm (the kernel's name of its command) and exe (its
 * executable's path), when known: `-tagfocus=comm=git`.
 */
#include "pprof.h"

#include "pprof.pb-c.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

enum { NVALUES = 4 };

/* The string-table indices of the labels' keys and unit. */
struct label_keys {
    int64_t pid, comm, exe, lifetime, nanoseconds;
};

/* The most labels a sample carries (label_sample). */
enum { MAX_LABELS = 4 };

/* The string-table indices of one process's command labels (0: none). */
struct command_strings {
    int64_t comm, exe;
};

/* Labels sample x, the i-th, with its process, its command and, if
 * lifetime_ns >= 0, the lifetime bucket of the freed blocks it holds;
 * labels and labelp have MAX_LABELS places per sample. */
static void label_sample(DdheapPprof__Sample *x, size_t i, DdheapPprof__Label *labels,
                         DdheapPprof__Label **labelp, const struct label_keys *keys,
                         uint32_t tgid, struct command_strings cmd, int64_t lifetime_ns)
{
    DdheapPprof__Label *l = &labels[MAX_LABELS * i];
    DdheapPprof__Label **lp = &labelp[MAX_LABELS * i];
    size_t n = 0;
    ddheap_pprof__label__init(&l[n]);
    l[n].key = keys->pid;
    l[n].num = tgid;
    lp[n] = &l[n];
    n++;
    const int64_t strings[2][2] = {{keys->comm, cmd.comm}, {keys->exe, cmd.exe}};
    for (int k = 0; k < 2; k++) {
        if (strings[k][1] == 0)
            continue;
        ddheap_pprof__label__init(&l[n]);
        l[n].key = strings[k][0];
        l[n].str = strings[k][1];
        lp[n] = &l[n];
        n++;
    }
    if (lifetime_ns >= 0) {
        ddheap_pprof__label__init(&l[n]);
        l[n].key = keys->lifetime;
        l[n].num = lifetime_ns;
        l[n].num_unit = keys->nanoseconds;
        lp[n] = &l[n];
        n++;
    }
    x->n_label = n;
    x->label = lp;
}

static int by_tgid(const void *a, const void *b)
{
    uint32_t x = ((const struct dd_prof_command *)a)->tgid;
    uint32_t y = ((const struct dd_prof_command *)b)->tgid;
    return (x > y) - (x < y);
}

static int64_t rounded(double v)
{
    return (int64_t)llround(v < 0 ? 0 : v);
}

/* A string-table index, interned into the report's table (which becomes
 * the profile's string table). */
static int64_t str(struct dd_prof_strings *strings, const char *s, int *failed)
{
    long i = dd_prof_strings_intern(strings, s);
    if (i < 0)
        *failed = 1;
    return i < 0 ? 0 : i;
}

static int gzip_to(FILE *out, const uint8_t *buf, size_t len)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    /* windowBits 15 + 16: a gzip header, which pprof expects. */
    if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        return -1;
    uint8_t chunk[1 << 16];
    z.next_in = (Bytef *)(uintptr_t)buf;
    z.avail_in = (uInt)len;
    int rc;
    do {
        z.next_out = chunk;
        z.avail_out = sizeof chunk;
        rc = deflate(&z, Z_FINISH);
        size_t have = sizeof chunk - z.avail_out;
        if (rc == Z_STREAM_ERROR || fwrite(chunk, 1, have, out) != have) {
            deflateEnd(&z);
            return -1;
        }
    } while (rc != Z_STREAM_END);
    deflateEnd(&z);
    return 0;
}

int dd_prof_write_pprof(FILE *out, const char *path, struct dd_prof_report *r,
                        const struct dd_prof_objects *objs, const struct dd_prof_meta *meta)
{
    /* The profile's string table is the report's, grown by the names
     * below. */
    struct dd_prof_strings *strings = &r->strings;
    int failed = 0, result = -1;

    DdheapPprof__Profile prof = DDHEAP_PPROF__PROFILE__INIT;
    static const char *const types[NVALUES][2] = {
        {"alloc_objects", "count"}, {"alloc_space", "bytes"},
        {"inuse_objects", "count"}, {"inuse_space", "bytes"}};
    DdheapPprof__ValueType vt[NVALUES], period_type = DDHEAP_PPROF__VALUE_TYPE__INIT;
    DdheapPprof__ValueType *vtp[NVALUES];
    for (int i = 0; i < NVALUES; i++) {
        ddheap_pprof__value_type__init(&vt[i]);
        vt[i].type = str(strings, types[i][0], &failed);
        vt[i].unit = str(strings, types[i][1], &failed);
        vtp[i] = &vt[i];
    }
    prof.n_sample_type = NVALUES;
    prof.sample_type = vtp;
    prof.default_sample_type = meta->alloc_first ? vt[1].type : vt[3].type;
    period_type.type = str(strings, "space", &failed);
    period_type.unit = str(strings, "bytes", &failed);
    prof.period_type = &period_type;
    prof.period = meta->period;
    prof.time_nanos = meta->time_nanos;
    prof.duration_nanos = meta->duration_nanos;

    size_t ns = r->nstacks, nl = r->addrs.n, nf = r->func_keys.n, nm = objs->n;
    size_t nsamples = ns;
    for (size_t i = 0; i < ns; i++)
        if (r->stacks[i].stack->life != NULL)
            for (unsigned k = 0; k < DD_PROF_LIFE_BUCKETS; k++)
                nsamples += r->stacks[i].stack->life->count[k] != 0;
    DdheapPprof__Sample *samples = calloc(nsamples + 1, sizeof *samples);
    DdheapPprof__Sample **samplep = calloc(nsamples + 1, sizeof *samplep);
    int64_t *values = calloc((nsamples + 1) * NVALUES, sizeof *values);
    DdheapPprof__Label *labels = calloc(MAX_LABELS * (nsamples + 1), sizeof *labels);
    DdheapPprof__Label **labelp = calloc(MAX_LABELS * (nsamples + 1), sizeof *labelp);
    const struct label_keys keys = {str(strings, "pid", &failed), str(strings, "comm", &failed),
                                    str(strings, "exe", &failed),
                                    str(strings, "lifetime", &failed),
                                    str(strings, "nanoseconds", &failed)};
    if (meta->ncommands)
        qsort(meta->commands, meta->ncommands, sizeof *meta->commands, by_tgid);
    uint64_t **loc_ids = calloc(ns + 1, sizeof *loc_ids);
    DdheapPprof__Location *locs = calloc(nl + 1, sizeof *locs);
    DdheapPprof__Location **locp = calloc(nl + 1, sizeof *locp);
    DdheapPprof__Line *lines = calloc((nl + 1) * DD_PROF_MAX_INLINE, sizeof *lines);
    DdheapPprof__Line **linep = calloc((nl + 1) * DD_PROF_MAX_INLINE, sizeof *linep);
    DdheapPprof__Function *funcs = calloc(nf + 1, sizeof *funcs);
    DdheapPprof__Function **funcp = calloc(nf + 1, sizeof *funcp);
    DdheapPprof__Mapping *maps = calloc(nm + 1, sizeof *maps);
    DdheapPprof__Mapping **mapp = calloc(nm + 1, sizeof *mapp);
    int64_t *comments = calloc(meta->ncomments + 1, sizeof *comments);
    uint8_t *packed = NULL;
    if (!samples || !samplep || !values || !labels || !labelp || !loc_ids || !locs || !locp ||
        !lines || !linep || !funcs || !funcp || !maps || !mapp || !comments)
        goto done;

    /* Mappings: every recorded object, the executable part of it, id =
     * index + 1 (pprof ids start at 1; 0 means none). */
    size_t n_maps = 0;
    for (size_t i = 0; i < nm; i++) {
        const struct dd_prof_object *o = &objs->v[i];
        DdheapPprof__Mapping *m = &maps[i];
        ddheap_pprof__mapping__init(m);
        m->id = i + 1;
        m->memory_start = o->exec_end ? o->exec_start : o->lo;
        m->memory_limit = o->exec_end ? o->exec_end : o->hi;
        m->file_offset = o->exec_end ? o->exec_offset : 0;
        m->filename = str(strings, o->path, &failed);
        m->build_id = str(strings, o->build_id, &failed);
        m->has_functions = true; /* symbolised here: pprof must not try again */
        m->has_filenames = r->any_lines;
        m->has_line_numbers = r->any_lines;
        m->has_inline_frames = true; /* expanded where DWARF scopes say */
        mapp[n_maps++] = m;
    }
    prof.n_mapping = n_maps;
    prof.mapping = mapp;

    for (size_t i = 0; i < nf; i++) {
        ddheap_pprof__function__init(&funcs[i]);
        funcs[i].id = i + 1;
        funcs[i].name = r->funcs[i].name;
        funcs[i].system_name = r->funcs[i].system_name;
        funcs[i].filename = r->funcs[i].file;
        funcp[i] = &funcs[i];
    }
    prof.n_function = nf;
    prof.function = funcp;

    for (size_t i = 0; i < nl; i++) {
        const struct dd_prof_location *l = &r->locs[i];
        ddheap_pprof__location__init(&locs[i]);
        locs[i].id = i + 1;
        locs[i].mapping_id = l->object >= 0 ? (uint64_t)l->object + 1 : 0;
        locs[i].address = l->addr;
        /* pprof's order too: inlined functions first, the caller last. */
        for (unsigned k = 0; k < l->n; k++) {
            size_t at = i * DD_PROF_MAX_INLINE + k;
            ddheap_pprof__line__init(&lines[at]);
            lines[at].function_id = l->function[k] + 1;
            lines[at].line = l->line[k];
            linep[at] = &lines[at];
        }
        locs[i].n_line = l->n;
        locs[i].line = &linep[i * DD_PROF_MAX_INLINE];
        locp[i] = &locs[i];
    }
    prof.n_location = nl;
    prof.location = locp;

    size_t n_samples = 0;
    for (size_t i = 0; i < ns; i++) {
        const struct dd_prof_resolved *s = &r->stacks[i];
        loc_ids[i] = malloc((s->n ? s->n : 1) * sizeof *loc_ids[i]);
        if (loc_ids[i] == NULL)
            goto done;
        for (uint32_t k = 0; k < s->n; k++)
            loc_ids[i][k] = s->locs[k] + 1;
        const struct dd_prof_lifetimes *life = s->stack->life;
        double freed_objects = 0, freed_space = 0;
        struct command_strings cmd = {0, 0};
        const struct dd_prof_command key = {.tgid = s->stack->tgid};
        const struct dd_prof_command *c =
            meta->ncommands ? bsearch(&key, meta->commands, meta->ncommands,
                                      sizeof *meta->commands, by_tgid)
                            : NULL;
        if (c != NULL) {
            cmd.comm = c->comm ? str(strings, c->comm, &failed) : 0;
            cmd.exe = c->exe ? str(strings, c->exe, &failed) : 0;
        }
        for (unsigned k = 0; life != NULL && k < DD_PROF_LIFE_BUCKETS; k++) {
            if (life->count[k] == 0)
                continue;
            DdheapPprof__Sample *y = &samples[n_samples];
            ddheap_pprof__sample__init(y);
            y->n_location_id = s->n;
            y->location_id = loc_ids[i];
            int64_t *v = &values[n_samples * NVALUES];
            v[0] = rounded(life->objects[k]);
            v[1] = rounded(life->space[k]);
            y->n_value = NVALUES;
            y->value = v;
            label_sample(y, n_samples, labels, labelp, &keys, s->stack->tgid, cmd,
                         (int64_t)dd_prof_life_bucket_start(k));
            samplep[n_samples++] = y;
            freed_objects += life->objects[k];
            freed_space += life->space[k];
        }
        DdheapPprof__Sample *x = &samples[n_samples];
        ddheap_pprof__sample__init(x);
        x->n_location_id = s->n;
        x->location_id = loc_ids[i];
        int64_t *v = &values[n_samples * NVALUES];
        v[0] = rounded(s->stack->alloc_objects - freed_objects);
        v[1] = rounded(s->stack->alloc_space - freed_space);
        v[2] = rounded(s->stack->inuse_objects);
        v[3] = rounded(s->stack->inuse_space);
        x->n_value = NVALUES;
        x->value = v;
        label_sample(x, n_samples, labels, labelp, &keys, s->stack->tgid, cmd, -1);
        samplep[n_samples++] = x;
    }
    prof.n_sample = n_samples;
    prof.sample = samplep;

    for (size_t i = 0; i < meta->ncomments; i++)
        comments[i] = str(strings, meta->comments[i], &failed);
    prof.n_comment = meta->ncomments;
    prof.comment = comments;
    if (failed)
        goto done;

    /* Last: the string table, now complete. */
    prof.n_string_table = strings->n;
    prof.string_table = strings->v;

    size_t len = ddheap_pprof__profile__get_packed_size(&prof);
    packed = malloc(len ? len : 1);
    if (packed == NULL)
        goto done;
    ddheap_pprof__profile__pack(&prof, packed);
    if (gzip_to(out, packed, len) != 0 || fflush(out) != 0) {
        fprintf(stderr, "ddheap-prof: writing %s: %s\n", path, strerror(errno));
        goto done;
    }
    result = 0;
done:
    if (result != 0 && !ferror(out))
        fprintf(stderr, "ddheap-prof: out of memory writing %s\n", path);
    if (loc_ids)
        for (size_t i = 0; i < ns; i++)
            free(loc_ids[i]);
    free(loc_ids);
    free(samples);
    free(samplep);
    free(values);
    free(labels);
    free(labelp);
    free(locs);
    free(locp);
    free(lines);
    free(linep);
    free(funcs);
    free(funcp);
    free(maps);
    free(mapp);
    free(comments);
    free(packed);
    return result;
}
