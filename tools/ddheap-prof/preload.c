/*
 * A command without ddheap's probes, run under libddheap_preload.so: the
 * decision (before the fork: the executable, the libraries the loader
 * names for it, an LD_PRELOAD already set, and the programs its arguments
 * name, for a wrapper such as env or unshare) and the environment the
 * command gets (in the child, before its exec). Where ddheap's libraries
 * are (this one and the agent, agent.c) is decided here too: the build
 * tree's when this ddheap-prof is the build tree's, else the installed
 * ones; DDHEAP_PRELOAD_LIB and DDHEAP_AGENT_LIB override, as for ddheap-run.
 */
#include <limits.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "prof.h"

const char *dd_prof_library(enum dd_prof_library which)
{
    static const char *const env[] = {"DDHEAP_PRELOAD_LIB", "DDHEAP_AGENT_LIB"};
    static const char *const built[] = {DD_PROF_PRELOAD_BUILT, DD_PROF_AGENT_BUILT};
    static const char *const installed[] = {DD_PROF_PRELOAD_INSTALLED, DD_PROF_AGENT_INSTALLED};
    const char *set = getenv(env[which]);
    if (set != NULL && set[0] != '\0')
        return set;
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    bool in_build_tree = n > 0 && (self[n] = '\0', strcmp(self, DD_PROF_BUILT_EXE) == 0);
    return in_build_tree ? built[which] : installed[which];
}

/* execvp's search: the file the command runs, or NULL. */
static char *command_path(const char *name)
{
    if (strchr(name, '/') != NULL)
        return access(name, X_OK) == 0 ? strdup(name) : NULL;
    const char *path = getenv("PATH");
    if (path == NULL)
        path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        size_t len = strcspn(path, ":");
        char candidate[PATH_MAX];
        if (len > 0 && snprintf(candidate, sizeof candidate, "%.*s/%s", (int)len, path, name) <
                           (int)sizeof candidate &&
            access(candidate, X_OK) == 0)
            return strdup(candidate);
        path += len + (path[len] == ':');
    }
    return NULL;
}

static void note_probes(const char *path, void *ctx)
{
    *(bool *)ctx |= (dd_prof_elf_probes(path, -1) & DD_PROF_HAS_ALLOC) != 0;
}

/* An object in LD_PRELOAD carries the probes already. */
static bool preloaded_with_probes(void)
{
    const char *list = getenv("LD_PRELOAD");
    bool found = false;
    while (list != NULL && *list && !found) {
        size_t len = strcspn(list, ": ");
        char name[PATH_MAX];
        if (len > 0 && len < sizeof name) {
            memcpy(name, list, len);
            name[len] = '\0';
            note_probes(name, &found);
        }
        list += len + (list[len] != '\0');
    }
    return found;
}

static bool is_script(const char *path)
{
    FILE *f = fopen(path, "re");
    char magic[2] = {0, 0};
    bool script = f != NULL && fread(magic, 1, 2, f) == 2 && magic[0] == '#' && magic[1] == '!';
    if (f)
        fclose(f);
    return script;
}

/* Whether the command's executable and the libraries it starts with lack
 * the probes (a script: its interpreter is not asked, it never has them;
 * ddheap-run preloads the library itself). */
static bool runs_without_probes(const char *path)
{
    if (is_script(path)) {
        const char *base = strrchr(path, '/');
        return strncmp(base ? base + 1 : path, "ddheap-run", 10) != 0;
    }
    if (dd_prof_elf_probes(path, -1) & DD_PROF_HAS_ALLOC)
        return false;
    char *interp = dd_prof_interpreter_of(path);
    if (interp == NULL) {
        fprintf(stderr, "ddheap-prof: %s is statically linked: its malloc cannot be wrapped\n",
                path);
        return false;
    }
    extern char **environ;
    bool found = false;
    dd_prof_list_libraries(interp, path, environ, note_probes, &found);
    free(interp);
    return !found;
}

/* A file named by one word of the text (a path, or a program found in
 * PATH) that carries the probes. Words end at blanks, '=' and ':', so
 * that LD_PRELOAD=/a.so:/b.so names its libraries. */
static bool names_probed_file(const char *text)
{
    bool found = false;
    while (*text && !found) {
        text += strspn(text, " \t\n=:");
        size_t len = strcspn(text, " \t\n=:");
        char word[PATH_MAX];
        if (len > 0 && len < sizeof word) {
            memcpy(word, text, len);
            word[len] = '\0';
            struct stat st;
            char *path = strchr(word, '/') ? NULL : command_path(word);
            const char *file = path ? path : word;
            if (stat(file, &st) == 0 && S_ISREG(st.st_mode))
                note_probes(file, &found);
            free(path);
        }
        text += len;
    }
    return found;
}

/* A wrapper (env, nice, unshare, sh -c "...") that runs a program with the
 * probes: one of its arguments names that program, or a library with them.
 * Preloading then would count that program's allocations twice. */
static bool arguments_name_probes(char **cmd)
{
    for (size_t i = 1; cmd[i] != NULL; i++)
        if (names_probed_file(cmd[i]))
            return true;
    return false;
}

const char *dd_prof_preload_for(const struct options *o)
{
    if (o->no_preload || preloaded_with_probes() || arguments_name_probes(o->cmd))
        return NULL;
    char *path = command_path(o->cmd[0]);
    bool wanted = path != NULL && runs_without_probes(path);
    free(path);
    if (!wanted)
        return NULL;
    const char *lib = dd_prof_library(DD_PROF_PRELOAD_LIB);
    if (access(lib, R_OK) != 0) {
        fprintf(stderr, "ddheap-prof: %s carries no %s probes and %s is missing (set "
                        "DDHEAP_PRELOAD_LIB)\n", o->cmd[0], o->provider, lib);
        return NULL;
    }
    fprintf(stderr, "ddheap-prof: %s carries no %s probes: running it with %s (--no-preload: "
                    "not)\n", o->cmd[0], o->provider, lib);
    return lib;
}

/* In the child. First in LD_PRELOAD, as ddheap-run puts it: an allocator
 * preloaded already comes after it and is the one it forwards to; only a
 * sanitizer's runtime, which must be first, stays ahead. */
void dd_prof_add_preload(const char *lib)
{
    const char *old = getenv("LD_PRELOAD");
    if (old == NULL)
        old = "";
    size_t first = strcspn(old, ": ");
    bool sanitizer = first > 0 && strstr(old, "san.so") != NULL &&
                     strstr(old, "san.so") < old + first;
    size_t size = strlen(old) + strlen(lib) + 2;
    char *value = malloc(size);
    if (value == NULL)
        return;
    if (sanitizer)
        snprintf(value, size, "%.*s:%s%s", (int)first, old, lib, old + first);
    else
        snprintf(value, size, "%s%s%s", lib, old[0] ? ":" : "", old);
    setenv("LD_PRELOAD", value, 1);
    free(value);
}
