/*
 * --http ADDR: the profile served as Go's net/http/pprof serves a heap, so
 * that `go tool pprof`, Grafana Alloy's pyroscope.scrape and Parca scrape
 * it (docs/fleet.md):
 *
 *   /debug/pprof/heap     the four heap sample types, inuse_space first
 *   /debug/pprof/allocs   the same profile, alloc_space the default
 *   ?seconds=N            the change over the next N seconds (1..300)
 *   /debug/pprof/         an index
 *
 * Threads: none. libmicrohttpd runs in external polling mode: its epoll
 * descriptor is one of the event loop's (loop.c), and MHD_run is called
 * from the loop after the ring buffers are drained, so a request reads the
 * table between two events and nothing else ever touches it. A delta
 * request is suspended (MHD_suspend_connection) until its end, while the
 * loop goes on and other clients are answered; the loop resumes it when
 * it is due and the handler, called again, answers it.
 *
 * What the network may send is bounded by libmicrohttpd's own limits:
 * connections in all and per client address, an idle time-out (a client
 * that never reads or never finishes its request is dropped), a memory
 * limit per connection (a longer request line or header is refused with
 * 414/431). Only GET and HEAD, only the paths above; nothing a request
 * says is ever used as a file name.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "prof.h"

#define MAX_DELTA_SECONDS 300
/* Connections in all: at most this many, and an eighth of the descriptor
 * budget (objects.c: files and unwinding take their shares of it too). A
 * quarter of them per client address. */
#define CONNECTION_LIMIT 512
#define IDLE_TIMEOUT_S 10
#define REQUEST_MEMORY (16 * 1024)
/* Delta requests waiting at once: each holds four doubles per stack (3 MiB
 * at --all's 100000 stacks); more are answered 503. */
#define MAX_DELTAS 16
/* A profile built less than this long ago from the same events is served
 * again (fifty scrapers at once cost one symbolisation). */
#define CACHE_NS 1000000000LL

/* A ?seconds=N request: the four totals of every stack at its start. */
struct delta {
    struct MHD_Connection *conn;
    int64_t started_ns, due_ns;
    double *start; /* 4 per stack: alloc_objects, alloc_space, inuse_objects, inuse_space */
    size_t nstart;
    bool alloc_first;
    bool suspended;
    struct delta *next; /* in the list of suspended ones */
};

/* The last full profile of each kind (heap, allocs) and the table's state
 * it was built from. */
struct cached {
    struct MHD_Response *response;
    uint64_t allocs, frees, dropped;
    size_t nprocs, nattached;
    int64_t built_ns;
};

struct dd_prof_http {
    struct MHD_Daemon *daemon;
    struct prof *p;
    struct delta *suspended;
    size_t nsuspended;
    struct cached cache[2];
    bool verbose;
};

/* Parses ADDR: PORT or :PORT (127.0.0.1), IPV4:PORT, [IPV6]:PORT,
 * localhost:PORT. Returns false if malformed. */
bool dd_prof_http_parse_addr(const char *addr, struct sockaddr_storage *ss, unsigned *len)
{
    char host[64] = "127.0.0.1";
    const char *colon = strrchr(addr, ':');
    const char *port_s = colon ? colon + 1 : addr;
    if (colon && colon != addr) {
        size_t n = (size_t)(colon - addr);
        if (n >= sizeof host)
            return false;
        memcpy(host, addr, n);
        host[n] = '\0';
    }
    char *end;
    errno = 0;
    long port = strtol(port_s, &end, 10);
    if (errno || end == port_s || *end || port < 0 || port > 65535)
        return false;
    memset(ss, 0, sizeof *ss);
    if (strcmp(host, "localhost") == 0)
        strcpy(host, "127.0.0.1");
    size_t hl = strlen(host);
    if (hl > 2 && host[0] == '[' && host[hl - 1] == ']') {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
        host[hl - 1] = '\0';
        if (inet_pton(AF_INET6, host + 1, &a->sin6_addr) != 1)
            return false;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)port);
        *len = sizeof *a;
        return true;
    }
    struct sockaddr_in *a = (struct sockaddr_in *)ss;
    if (inet_pton(AF_INET, host, &a->sin_addr) != 1)
        return false;
    a->sin_family = AF_INET;
    a->sin_port = htons((uint16_t)port);
    *len = sizeof *a;
    return true;
}

static void log_mhd(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    fputs("ddheap-prof: http: ", stderr);
    vfprintf(stderr, fmt, ap);
}

static enum MHD_Result answer_text(struct MHD_Connection *c, unsigned status, const char *type,
                                   const char *text)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), (void *)(uintptr_t)text,
                                        MHD_RESPMEM_MUST_COPY);
    if (r == NULL)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result answer_error(struct MHD_Connection *c, unsigned status, const char *text)
{
    return answer_text(c, status, "text/plain; charset=utf-8", text);
}

static const char index_page[] =
    "<!DOCTYPE html>\n<html><head><title>/debug/pprof/</title></head><body>\n"
    "<p>ddheap-prof: the sampled heap of the processes it profiles, as gzipped pprof "
    "profiles (go tool pprof URL).</p>\n<ul>\n"
    "<li><a href=\"allocs\">allocs</a>: every sampled allocation since the start "
    "(alloc_space first), and what is live</li>\n"
    "<li><a href=\"heap\">heap</a>: the same profile, what is live (inuse_space) first</li>\n"
    "</ul>\n<p>?seconds=N (1 to 300): the change over the next N seconds.</p>\n"
    "</body></html>\n";

/* A gzipped pprof response, sharing buf (malloc'd; freed with it). */
static struct MHD_Response *profile_response(char *buf, size_t len, bool alloc_first)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, buf, MHD_RESPMEM_MUST_FREE);
    if (r == NULL) {
        free(buf);
        return NULL;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_DISPOSITION,
                            alloc_first ? "attachment; filename=\"allocs\""
                                        : "attachment; filename=\"heap\"");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    return r;
}

static bool cache_fresh(const struct cached *k, const struct prof *p, int64_t now)
{
    return k->response && now - k->built_ns < CACHE_NS && k->allocs == p->table.allocs &&
           k->frees == p->table.frees && k->dropped == p->table.dropped &&
           k->nprocs == p->proc_ids.n && k->nattached == p->nattached;
}

static enum MHD_Result answer_profile(struct dd_prof_http *h, struct MHD_Connection *c,
                                      bool alloc_first)
{
    struct prof *p = h->p;
    int64_t now = dd_prof_now_ns(CLOCK_MONOTONIC);
    struct cached *k = &h->cache[alloc_first];
    if (!cache_fresh(k, p, now)) {
        char *buf;
        size_t len;
        char note[160];
        snprintf(note, sizeof note, "ddheap-prof: served at %.3f s into the run%s",
                 (double)(now - p->started_mono) / 1e9, alloc_first ? " (allocs)" : "");
        if (dd_prof_profile_bytes(p, &p->table, p->started_mono, now, note, alloc_first, &buf,
                                  &len) != 0)
            return answer_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
        struct MHD_Response *r = profile_response(buf, len, alloc_first);
        if (r == NULL)
            return MHD_NO;
        if (k->response)
            MHD_destroy_response(k->response); /* queued ones hold their own reference */
        *k = (struct cached){r, p->table.allocs, p->table.frees, p->table.dropped,
                             p->proc_ids.n, p->nattached, now};
    }
    return MHD_queue_response(c, MHD_HTTP_OK, k->response);
}

/* The four totals of every stack now (a delta's start). */
static int record_start(const struct prof *p, struct delta *d)
{
    const struct dd_prof_table *t = &p->table;
    d->start = malloc((t->nstacks ? t->nstacks : 1) * 4 * sizeof *d->start);
    if (d->start == NULL)
        return -1;
    for (size_t i = 0; i < t->nstacks; i++) {
        const struct dd_prof_stack *s = &t->stacks[i];
        double *v = &d->start[4 * i];
        v[0] = s->alloc_objects;
        v[1] = s->alloc_space;
        v[2] = s->inuse_objects;
        v[3] = s->inuse_space;
    }
    d->nstart = t->nstacks;
    return 0;
}

/* The change since the delta's start: a view of the table (as the peak
 * view, table.h) whose totals are now minus then, all four, as Go's
 * delta profiles are. Stacks are never removed, so index i is the same
 * stack then and now. Lifetimes are not split out in a delta. */
static enum MHD_Result answer_delta(struct dd_prof_http *h, struct MHD_Connection *c,
                                    struct delta *d)
{
    struct prof *p = h->p;
    struct dd_prof_table view;
    if (dd_prof_table_peak_view(&p->table, &view) != 0)
        return answer_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
    for (size_t i = 0; i < view.nstacks; i++) {
        struct dd_prof_stack *s = &view.stacks[i];
        const struct dd_prof_stack *now = &p->table.stacks[i];
        const double *then = i < d->nstart ? &d->start[4 * i] : NULL;
        s->alloc_objects = now->alloc_objects - (then ? then[0] : 0);
        s->alloc_space = now->alloc_space - (then ? then[1] : 0);
        s->inuse_objects = now->inuse_objects - (then ? then[2] : 0);
        s->inuse_space = now->inuse_space - (then ? then[3] : 0);
    }
    int64_t now_ns = dd_prof_now_ns(CLOCK_MONOTONIC);
    char note[200];
    snprintf(note, sizeof note,
             "ddheap-prof: a delta profile: the change over %.3f s, to %.3f s into the run "
             "(negative inuse: freed more than allocated)",
             (double)(now_ns - d->started_ns) / 1e9, (double)(now_ns - p->started_mono) / 1e9);
    char *buf;
    size_t len;
    int rc = dd_prof_profile_bytes(p, &view, d->started_ns, now_ns, note, d->alloc_first, &buf,
                                   &len);
    free(view.stacks);
    if (rc != 0)
        return answer_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
    struct MHD_Response *r = profile_response(buf, len, d->alloc_first);
    if (r == NULL)
        return MHD_NO;
    enum MHD_Result ok = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ok;
}

/* ?seconds=N: records the start and suspends the connection. */
static enum MHD_Result start_delta(struct dd_prof_http *h, struct MHD_Connection *c,
                                   const char *seconds, bool alloc_first, void **req_cls)
{
    char *end;
    errno = 0;
    long n = strtol(seconds, &end, 10);
    if (errno || end == seconds || *end || n <= 0 || n > MAX_DELTA_SECONDS)
        return answer_error(c, MHD_HTTP_BAD_REQUEST,
                            "seconds must be a whole number of seconds, 1 to 300\n");
    if (h->nsuspended >= MAX_DELTAS)
        return answer_error(c, MHD_HTTP_SERVICE_UNAVAILABLE,
                            "too many delta profiles pending; try again later\n");
    struct delta *d = calloc(1, sizeof *d);
    if (d == NULL || record_start(h->p, d) != 0) {
        free(d);
        return answer_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
    }
    d->conn = c;
    d->started_ns = dd_prof_now_ns(CLOCK_MONOTONIC);
    d->due_ns = d->started_ns + n * 1000000000LL;
    d->alloc_first = alloc_first;
    d->suspended = true;
    d->next = h->suspended;
    h->suspended = d;
    h->nsuspended++;
    *req_cls = d;
    MHD_suspend_connection(c);
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **req_cls)
{
    struct dd_prof_http *h = cls;
    (void)version;
    (void)upload_data;
    if (*req_cls != NULL) {
        /* Called again: a delta resumed at its end, or more of a body,
         * which is not read (GET has none worth reading). */
        struct delta *d = *req_cls;
        if (d->suspended)
            return MHD_YES;
        if (*upload_data_size) {
            *upload_data_size = 0;
            return MHD_YES;
        }
        return answer_delta(h, c, d);
    }
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return answer_error(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD\n");
    if (strcmp(url, "/debug/pprof/") == 0 || strcmp(url, "/debug/pprof") == 0)
        return answer_text(c, MHD_HTTP_OK, "text/html; charset=utf-8", index_page);
    bool heap = strcmp(url, "/debug/pprof/heap") == 0;
    bool allocs = strcmp(url, "/debug/pprof/allocs") == 0;
    if (!heap && !allocs)
        return answer_error(c, MHD_HTTP_NOT_FOUND, "404 page not found\n");
    const char *debug = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "debug");
    if (debug && strcmp(debug, "0") != 0)
        return answer_error(c, MHD_HTTP_BAD_REQUEST,
                            "debug=N is not served: the profile is pprof only (go tool pprof "
                            "-top URL reads it as text)\n");
    const char *seconds = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "seconds");
    if (seconds)
        return start_delta(h, c, seconds, allocs, req_cls);
    return answer_profile(h, c, allocs);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **req_cls,
                         enum MHD_RequestTerminationCode why)
{
    (void)c;
    (void)why;
    struct dd_prof_http *h = cls;
    struct delta *d = *req_cls;
    if (d == NULL)
        return;
    for (struct delta **at = &h->suspended; *at; at = &(*at)->next)
        if (*at == d) {
            *at = d->next;
            h->nsuspended--;
            break;
        }
    free(d->start);
    free(d);
    *req_cls = NULL;
}

/* Descriptors: every connection is one, and the files' and unwinding's
 * shares are of the same limit (objects.c): the soft limit goes up to the
 * hard one. */
static void raise_fd_limit(void)
{
    struct rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
        r.rlim_cur = r.rlim_max;
        setrlimit(RLIMIT_NOFILE, &r);
    }
}

int dd_prof_http_start(struct prof *p)
{
    struct sockaddr_storage ss;
    unsigned len;
    if (!dd_prof_http_parse_addr(p->opt.http_addr, &ss, &len)) {
        fprintf(stderr, "ddheap-prof: --http %s: not an address (PORT, :PORT, IP:PORT, "
                        "[IPV6]:PORT)\n", p->opt.http_addr);
        return -1;
    }
    raise_fd_limit();
    unsigned connections = dd_prof_fd_budget() / 8;
    if (connections > CONNECTION_LIMIT)
        connections = CONNECTION_LIMIT;
    if (connections < 16)
        connections = 16;
    struct dd_prof_http *h = calloc(1, sizeof *h);
    if (h == NULL)
        return -1;
    h->p = p;
    unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME;
    if (ss.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    if (p->opt.verbose)
        flags |= MHD_USE_ERROR_LOG;
    uint16_t port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                             : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    h->daemon = MHD_start_daemon(
        flags, port, NULL, NULL, on_request, h,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
        MHD_OPTION_CONNECTION_LIMIT, connections,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, connections / 4,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)IDLE_TIMEOUT_S,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)REQUEST_MEMORY,
        MHD_OPTION_STRICT_FOR_CLIENT, 1,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
        MHD_OPTION_EXTERNAL_LOGGER, log_mhd, NULL,
        MHD_OPTION_END);
    if (h->daemon == NULL) {
        fprintf(stderr, "ddheap-prof: --http %s: cannot listen there (in use, or not an "
                        "address of this host)\n", p->opt.http_addr);
        free(h);
        return -1;
    }
    const union MHD_DaemonInfo *bound = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    char shown[INET6_ADDRSTRLEN] = "?";
    if (ss.ss_family == AF_INET6)
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, shown, sizeof shown);
    else
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, shown, sizeof shown);
    fprintf(stderr, "ddheap-prof: serving http://%s%s%s:%u/debug/pprof/\n",
            ss.ss_family == AF_INET6 ? "[" : "", shown, ss.ss_family == AF_INET6 ? "]" : "",
            bound ? (unsigned)bound->port : (unsigned)port);
    p->http = h;
    return 0;
}

int dd_prof_http_fd(const struct prof *p)
{
    if (p->http == NULL)
        return -1;
    const union MHD_DaemonInfo *i = MHD_get_daemon_info(p->http->daemon, MHD_DAEMON_INFO_EPOLL_FD);
    return i ? i->epoll_fd : -1;
}

int64_t dd_prof_http_wait_ns(const struct prof *p, int64_t now_ns, int64_t wait_ns)
{
    if (p->http == NULL)
        return wait_ns;
    MHD_UNSIGNED_LONG_LONG ms;
    if (MHD_get_timeout(p->http->daemon, &ms) == MHD_YES && (int64_t)ms * 1000000 < wait_ns)
        wait_ns = (int64_t)ms * 1000000;
    for (const struct delta *d = p->http->suspended; d; d = d->next)
        if (d->due_ns - now_ns < wait_ns)
            wait_ns = d->due_ns > now_ns ? d->due_ns - now_ns : 0;
    return wait_ns;
}

void dd_prof_http_run(struct prof *p)
{
    struct dd_prof_http *h = p->http;
    if (h == NULL)
        return;
    int64_t now = dd_prof_now_ns(CLOCK_MONOTONIC);
    for (struct delta **at = &h->suspended; *at;) {
        struct delta *d = *at;
        if (d->due_ns > now) {
            at = &d->next;
            continue;
        }
        *at = d->next;
        d->suspended = false;
        h->nsuspended--;
        MHD_resume_connection(d->conn);
    }
    MHD_run(h->daemon);
}

void dd_prof_http_stop(struct prof *p)
{
    struct dd_prof_http *h = p->http;
    if (h == NULL)
        return;
    /* A suspended connection must be resumed before the daemon stops
     * (libmicrohttpd's rule); their clients see the connection close. */
    for (struct delta *d = h->suspended; d; d = d->next) {
        d->suspended = false;
        MHD_resume_connection(d->conn);
    }
    h->suspended = NULL;
    h->nsuspended = 0;
    MHD_stop_daemon(h->daemon);
    for (int i = 0; i < 2; i++)
        if (h->cache[i].response)
            MHD_destroy_response(h->cache[i].response);
    free(h);
    p->http = NULL;
}
