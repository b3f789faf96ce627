/*
 * What the dynamic loader maps for an executable before it runs: its
 * interpreter (PT_INTERP) and the libraries the loader's own `--list`
 * names for it under a given environment (LD_PRELOAD and LD_LIBRARY_PATH
 * included). Used before a command starts (does it carry probes? preload.c)
 * and at an exec whose loader cannot be hooked (attach.c).
 */
#include <fcntl.h>
#include <gelf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "prof.h"

char *dd_prof_interpreter_of(const char *exe)
{
    int fd = open(exe, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || elf_version(EV_CURRENT) == EV_NONE) {
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    char *interp = NULL;
    Elf *elf = elf_begin(fd, ELF_C_READ, NULL);
    size_t n;
    if (elf && elf_getphdrnum(elf, &n) == 0) {
        for (size_t i = 0; i < n && !interp; i++) {
            GElf_Phdr ph;
            if (!gelf_getphdr(elf, (int)i, &ph) || ph.p_type != PT_INTERP || ph.p_filesz > 4096)
                continue;
            size_t len;
            const char *raw = elf_rawfile(elf, &len);
            if (raw && ph.p_offset + ph.p_filesz <= len)
                interp = strndup(raw + ph.p_offset, ph.p_filesz);
        }
    }
    if (elf)
        elf_end(elf);
    close(fd);
    return interp;
}

void dd_prof_list_libraries(const char *interp, const char *exe, char **env,
                            void (*each)(const char *path, void *ctx), void *ctx)
{
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
        return;
    pid_t lister = fork();
    if (lister == 0) {
        dup2(fds[1], STDOUT_FILENO);
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0)
            dup2(null, STDERR_FILENO);
        char *argv[] = {(char *)interp, (char *)"--list", (char *)exe, NULL};
        execve(interp, argv, env);
        _exit(127);
    }
    close(fds[1]);
    FILE *f = lister > 0 ? fdopen(fds[0], "r") : NULL;
    if (f == NULL)
        close(fds[0]);
    char *line = NULL;
    size_t cap = 0;
    while (f && getline(&line, &cap, f) > 0) {
        /* "\tlibx.so => /path/libx.so (0x...)" or "\t/path/lib.so (0x...)" */
        char *path = strstr(line, "=> ");
        path = path ? path + 3 : line + strspn(line, " \t");
        if (*path != '/')
            continue;
        path[strcspn(path, " \t\n")] = '\0';
        each(path, ctx);
    }
    free(line);
    if (f)
        fclose(f);
    if (lister > 0)
        waitpid(lister, NULL, 0);
}
