/*
 * Folded stacks and the flame-graph SVG (flame.h). Both start from the
 * same merge: each stack becomes its function names, root first, and
 * stacks with the same names are summed (addresses differ, names do not).
 * The SVG lays the merged stacks out as a tree, siblings in name order,
 * one rectangle per node, and embeds a short script for click-to-zoom,
 * search and fitting labels to their boxes.
 */
#include "flame.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"

const char *const dd_prof_value_names[4] = {"alloc_objects", "alloc_space", "inuse_objects",
                                            "inuse_space"};

static double value_of(const struct dd_prof_stack *s, enum dd_prof_value v)
{
    switch (v) {
    case DD_PROF_ALLOC_OBJECTS: return s->alloc_objects;
    case DD_PROF_ALLOC_SPACE: return s->alloc_space;
    case DD_PROF_INUSE_OBJECTS: return s->inuse_objects;
    case DD_PROF_INUSE_SPACE: return s->inuse_space;
    }
    return 0;
}

/* Merged stacks: keys[i] is a folded name path, sums[i] its value. */
struct merged {
    struct dd_prof_strings keys;
    double *sums;
    size_t cap;
};

static const char *function_name(const struct dd_prof_report *r, uint32_t fn)
{
    return r->strings.v[r->funcs[fn].name];
}

static int merge(struct merged *m, const struct dd_prof_report *r, enum dd_prof_value v)
{
    memset(m, 0, sizeof *m);
    char *buf = NULL;
    size_t cap = 0;
    for (size_t i = 0; i < r->nstacks; i++) {
        const struct dd_prof_resolved *s = &r->stacks[i];
        size_t len = 0;
        /* Root first: outer locations first, and within a location the
         * frame's own function before what was inlined into it. */
        for (uint32_t k = s->n, j = 0; k > 0;) {
            const struct dd_prof_location *l = &r->locs[s->locs[k - 1]];
            const char *name = function_name(r, l->function[l->n - 1 - j]);
            /* An interpreter's function is known by its file and line. */
            char with_line[768];
            if (l->interp) {
                const char *file = r->strings.v[r->funcs[l->function[0]].file];
                if (*file)
                    snprintf(with_line, sizeof with_line, "%s (%s:%d)", name, file, l->line[0]);
                else /* a code object gone before it was read: its first line */
                    snprintf(with_line, sizeof with_line, "%s (line %d)", name, l->line[0]);
                name = with_line;
            }
            if (++j == l->n) {
                j = 0;
                k--;
            }
            size_t n = strlen(name);
            if (dd_prof_grow(&buf, &cap, len + n + 2, 1) != 0) /* ';' and the NUL */
                goto fail;
            if (len)
                buf[len++] = ';';
            /* ';' separates frames and a line is one stack. A space is
             * kept (C++ names have them): the value is after the last one. */
            for (size_t c = 0; c < n; c++)
                buf[len++] = name[c] == ';' || name[c] == '\n' ? '_' : name[c];
        }
        if (len == 0) {
            free(buf);
            buf = strdup("[unknown]");
            cap = buf ? 10 : 0;
            if (buf == NULL)
                goto fail;
            len = 9;
        }
        buf[len] = '\0';
        long k = dd_prof_strings_intern(&m->keys, buf);
        if (k < 0)
            goto fail;
        size_t old_cap = m->cap;
        if (dd_prof_grow(&m->sums, &m->cap, (size_t)k + 1, sizeof *m->sums) != 0)
            goto fail;
        for (size_t j = old_cap; j < m->cap; j++)
            m->sums[j] = 0;
        m->sums[k] += value_of(s->stack, v);
    }
    free(buf);
    return 0;
fail:
    free(buf);
    dd_prof_strings_free(&m->keys);
    free(m->sums);
    return -1;
}

static void merged_free(struct merged *m)
{
    dd_prof_strings_free(&m->keys);
    free(m->sums);
}

int dd_prof_write_folded(FILE *out, const struct dd_prof_report *r, enum dd_prof_value v)
{
    struct merged m;
    if (merge(&m, r, v) != 0)
        return -1;
    for (size_t i = 0; i < m.keys.n; i++) {
        long long value = llround(m.sums[i]);
        if (value > 0)
            fprintf(out, "%s %lld\n", m.keys.v[i], value);
    }
    merged_free(&m);
    return ferror(out) ? -1 : 0;
}

/* --- the SVG ----------------------------------------------------------- */

struct node {
    const char *name; /* points into a merged key (not terminated at ';') */
    size_t name_len;
    double value;
    struct node *child, *next; /* children kept in name order */
};

static struct node *new_node(const char *name, size_t len)
{
    struct node *n = calloc(1, sizeof *n);
    if (n) {
        n->name = name;
        n->name_len = len;
    }
    return n;
}

static int cmp_name(const struct node *n, const char *name, size_t len)
{
    size_t k = n->name_len < len ? n->name_len : len;
    int c = memcmp(n->name, name, k);
    return c ? c : (n->name_len > len) - (n->name_len < len);
}

/* Adds value along the path "a;b;c" below root. */
static int insert(struct node *root, const char *path, double value)
{
    root->value += value;
    struct node *at = root;
    while (*path) {
        size_t len = strcspn(path, ";");
        struct node **link = &at->child;
        while (*link && cmp_name(*link, path, len) < 0)
            link = &(*link)->next;
        if (*link == NULL || cmp_name(*link, path, len) != 0) {
            struct node *n = new_node(path, len);
            if (n == NULL)
                return -1;
            n->next = *link;
            *link = n;
        }
        at = *link;
        at->value += value;
        path += len + (path[len] == ';');
    }
    return 0;
}

static void free_tree(struct node *n)
{
    while (n) {
        struct node *next = n->next;
        free_tree(n->child);
        free(n);
        n = next;
    }
}

static int depth_of(const struct node *n)
{
    int d = 0;
    for (const struct node *c = n->child; c; c = c->next) {
        int k = depth_of(c);
        if (k > d)
            d = k;
    }
    return d + 1;
}

static void put_escaped(FILE *out, const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        switch (s[i]) {
        case '&': fputs("&amp;", out); break;
        case '<': fputs("&lt;", out); break;
        case '>': fputs("&gt;", out); break;
        case '"': fputs("&quot;", out); break;
        default: fputc(s[i], out);
        }
    }
}

/* Warm colours, stable per name so the same function keeps its colour. */
static void colour_of(const char *name, size_t len, int *r, int *g, int *b)
{
    unsigned h = 2166136261u;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)name[i]) * 16777619u;
    *r = 205 + (int)(h % 50);
    *g = 80 + (int)((h >> 8) % 130);
    *b = (int)((h >> 16) % 55);
}

enum { WIDTH = 1200, FRAME_H = 16, PAD_TOP = 50, PAD_SIDE = 10, PAD_BOTTOM = 30 };

/* One <g> per node: x and width in per-mille of the total are carried as
 * data attributes too, so the script can zoom without re-parsing. */
static void emit(FILE *out, const struct node *n, double x, int level, int height, double total,
                 const char *unit)
{
    double usable = WIDTH - 2 * PAD_SIDE;
    double w = n->value / total * usable;
    if (w < 0.1)
        return;
    int y = height - PAD_BOTTOM - (level + 1) * FRAME_H;
    int r, g, b;
    colour_of(n->name, n->name_len, &r, &g, &b);
    fprintf(out, "<g class=\"f\" data-x=\"%.3f\" data-w=\"%.3f\"><title>", x, w);
    put_escaped(out, n->name, n->name_len);
    fprintf(out, " (%.0f %s, %.2f%%)</title><rect x=\"%.3f\" y=\"%d\" width=\"%.3f\" height=\"%d\" "
                 "fill=\"rgb(%d,%d,%d)\" rx=\"2\"/><text x=\"%.3f\" y=\"%d\">",
            n->value, unit, 100 * n->value / total, PAD_SIDE + x, y, w, FRAME_H - 1, r, g, b,
            PAD_SIDE + x + 3, y + FRAME_H - 4);
    put_escaped(out, n->name, n->name_len);
    fputs("</text></g>\n", out);
    double cx = x;
    for (const struct node *c = n->child; c; c = c->next) {
        emit(out, c, cx, level + 1, height, total, unit);
        cx += c->value / total * usable;
    }
}

/* The viewer: labels fitted to their boxes; click a frame to zoom to it
 * (its ancestors stay, full width; other frames outside it hide); the
 * "Search" text asks for a regular expression and highlights matching
 * frames with the share they cover; "Reset zoom" returns. Sets
 * data-ddheap-ready on the root element when it has run, so a test can
 * tell a page whose script failed. */
static const char script[] =
    "<script type=\"text/ecmascript\"><![CDATA[\n"
    "'use strict';\n"
    "(function () {\n"
    "  const svg = document.documentElement;\n"
    "  const W = parseFloat(svg.getAttribute('data-width'));\n"
    "  const SIDE = parseFloat(svg.getAttribute('data-side'));\n"
    "  const frames = Array.from(document.querySelectorAll('g.f'));\n"
    "  const name = g => g.querySelector('title').textContent.replace(/ \\([^(]*\\)$/, '');\n"
    "  function fit(g) {\n"
    "    const r = g.querySelector('rect'), t = g.querySelector('text');\n"
    "    const w = parseFloat(r.getAttribute('width')), full = name(g);\n"
    "    const room = Math.floor((w - 6) / 7);\n"
    "    t.textContent = room >= full.length ? full : room >= 3 ? full.slice(0, room - 2) + '..' : '';\n"
    "  }\n"
    "  function place(g, x, w) {\n"
    "    const r = g.querySelector('rect'), t = g.querySelector('text');\n"
    "    r.setAttribute('x', SIDE + x); r.setAttribute('width', w);\n"
    "    t.setAttribute('x', SIDE + x + 3); fit(g);\n"
    "  }\n"
    "  function zoom(target) {\n"
    "    const x0 = parseFloat(target.dataset.x), w0 = parseFloat(target.dataset.w);\n"
    "    const y0 = parseFloat(target.querySelector('rect').getAttribute('y'));\n"
    "    const scale = (W - 2 * SIDE) / w0;\n"
    "    for (const g of frames) {\n"
    "      const x = parseFloat(g.dataset.x), w = parseFloat(g.dataset.w);\n"
    "      const y = parseFloat(g.querySelector('rect').getAttribute('y'));\n"
    "      const inside = x >= x0 - 1e-6 && x + w <= x0 + w0 + 1e-6;\n"
    "      const ancestor = y > y0 && x <= x0 + 1e-6 && x + w >= x0 + w0 - 1e-6;\n"
    "      if (ancestor) { g.style.display = ''; g.classList.add('parent'); place(g, 0, W - 2 * SIDE); }\n"
    "      else if (inside && y <= y0) { g.style.display = ''; g.classList.remove('parent'); place(g, (x - x0) * scale, w * scale); }\n"
    "      else g.style.display = 'none';\n"
    "    }\n"
    "    document.getElementById('reset').style.opacity = 1;\n"
    "  }\n"
    "  function reset() {\n"
    "    for (const g of frames) { g.style.display = ''; g.classList.remove('parent');\n"
    "      place(g, parseFloat(g.dataset.x), parseFloat(g.dataset.w)); }\n"
    "    document.getElementById('reset').style.opacity = 0.3;\n"
    "  }\n"
    "  function search(re) {\n"
    "    let covered = [];\n"
    "    for (const g of frames) {\n"
    "      const hit = re !== null && re.test(name(g));\n"
    "      g.classList.toggle('hit', hit);\n"
    "      if (hit) covered.push([parseFloat(g.dataset.x), parseFloat(g.dataset.w)]);\n"
    "    }\n"
    "    covered.sort((a, b) => a[0] - b[0]);\n"
    "    let sum = 0, end = -1;\n"
    "    for (const [x, w] of covered) {\n"
    "      if (x >= end) { sum += w; end = x + w; } else if (x + w > end) { sum += x + w - end; end = x + w; }\n"
    "    }\n"
    "    document.getElementById('matched').textContent =\n"
    "      re === null ? '' : 'Matched: ' + (100 * sum / (W - 2 * SIDE)).toFixed(2) + '%';\n"
    "  }\n"
    "  frames.forEach(fit);\n"
    "  for (const g of frames) g.addEventListener('click', () => zoom(g));\n"
    "  document.getElementById('reset').addEventListener('click', reset);\n"
    "  document.getElementById('search').addEventListener('click', () => {\n"
    "    const term = window.prompt('Search for (regular expression)', '');\n"
    "    if (term === null || term === '') { search(null); return; }\n"
    "    try { search(new RegExp(term)); } catch (e) { window.alert('Bad expression: ' + e.message); }\n"
    "  });\n"
    "  window.ddheapFlame = {zoom, reset, search, frames};\n"
    "  svg.setAttribute('data-ddheap-ready', String(frames.length));\n"
    "})();\n"
    "]]></script>\n";

int dd_prof_write_svg(FILE *out, const struct dd_prof_report *r, enum dd_prof_value v,
                      const char *title)
{
    return dd_prof_write_svg_noted(out, r, v, title, NULL);
}

int dd_prof_write_svg_noted(FILE *out, const struct dd_prof_report *r, enum dd_prof_value v,
                            const char *title, const char *note)
{
    struct merged m;
    if (merge(&m, r, v) != 0)
        return -1;
    struct node root = {.name = "all", .name_len = 3};
    int rc = 0;
    for (size_t i = 0; i < m.keys.n && rc == 0; i++)
        if (m.sums[i] > 0)
            rc = insert(&root, m.keys.v[i], m.sums[i]);
    if (rc == 0) {
        int levels = depth_of(&root);
        int height = PAD_TOP + levels * FRAME_H + PAD_BOTTOM;
        const char *unit = v == DD_PROF_ALLOC_SPACE || v == DD_PROF_INUSE_SPACE ? "bytes" : "objects";
        fprintf(out,
                "<?xml version=\"1.0\" standalone=\"no\"?>\n"
                "<svg version=\"1.1\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                "data-width=\"%d\" data-side=\"%d\" xmlns=\"http://www.w3.org/2000/svg\">\n"
                "<style>text { font: 12px monospace; fill: #000; pointer-events: none; }\n"
                "g.f { cursor: pointer; } g.f:hover rect { stroke: #000; stroke-width: 0.5; }\n"
                "g.parent rect { opacity: 0.5; } g.hit rect { fill: rgb(230,0,230); }\n"
                ".ctl { cursor: pointer; font: 12px sans-serif; fill: #333; }\n"
                "#head { font: 17px sans-serif; text-anchor: middle; }</style>\n"
                "<rect width=\"100%%\" height=\"100%%\" fill=\"#f8f8f0\"/>\n"
                "<text id=\"head\" x=\"%d\" y=\"24\">",
                WIDTH, height, WIDTH, height, WIDTH, PAD_SIDE, WIDTH / 2);
        put_escaped(out, title, strlen(title));
        fprintf(out,
                "</text>\n"
                "<text id=\"reset\" class=\"ctl\" x=\"%d\" y=\"24\" opacity=\"0.3\">Reset zoom</text>\n"
                "<text id=\"search\" class=\"ctl\" x=\"%d\" y=\"24\">Search</text>\n"
                "<text id=\"matched\" class=\"ctl\" x=\"%d\" y=\"%d\"></text>\n",
                PAD_SIDE, WIDTH - PAD_SIDE - 50, WIDTH - PAD_SIDE - 160, height - 10);
        if (note != NULL) {
            fprintf(out, "<text id=\"note\" x=\"%d\" y=\"43\" text-anchor=\"middle\" "
                         "style=\"font: 13px sans-serif\">", WIDTH / 2);
            put_escaped(out, note, strlen(note));
            fputs("</text>\n", out);
        }
        if (root.value > 0)
            emit(out, &root, 0, 0, height, root.value, unit);
        fputs(script, out);
        fputs("</svg>\n", out);
    }
    free_tree(root.child);
    merged_free(&m);
    return rc != 0 || ferror(out) ? -1 : 0;
}
