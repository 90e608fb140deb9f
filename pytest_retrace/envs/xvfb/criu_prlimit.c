/* Preloaded into CRIU where root lacks CAP_SYS_RESOURCE (some container hosts drop it).

   CRIU reads each dumped process's resource limits with prlimit64(pid, resource, NULL, &old). The kernel lets a
   caller read another process's limits only if every uid and gid of both match or the caller has
   CAP_SYS_RESOURCE; the task's processes run as their own user, so without the capability every dump of a
   task failed ("Can't get rlimit 0: Operation not permitted"). The same numbers are in /proc/PID/limits,
   which anyone may read: on that one refusal, and only for a read, they are taken from there.
   Built by pytest_retrace/envs/xvfb/checkpoint.py with the machine's C compiler. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>

/* /proc/PID/limits: a header, then one line per resource in the kernel's order (RLIMIT_CPU = 0 first); the
   soft and hard values start at column 26, either a number or "unlimited". */
static int limits_from_proc(long pid, long resource, struct rlimit *out) {
    char path[64], line[256], soft[32], hard[32];
    snprintf(path, sizeof path, "/proc/%ld/limits", pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int found = -1;
    for (long index = -1; fgets(line, sizeof line, f); index++) {
        if (index != resource) continue;
        if (strlen(line) > 26 && sscanf(line + 26, "%31s %31s", soft, hard) == 2) {
            out->rlim_cur = strcmp(soft, "unlimited") ? strtoull(soft, NULL, 10) : RLIM_INFINITY;
            out->rlim_max = strcmp(hard, "unlimited") ? strtoull(hard, NULL, 10) : RLIM_INFINITY;
            found = 0;
        }
        break;
    }
    fclose(f);
    return found;
}

long syscall(long number, ...) {
    static long (*real)(long, ...);
    long a[6];
    va_list ap;
    va_start(ap, number);
    for (int i = 0; i < 6; i++) a[i] = va_arg(ap, long);
    va_end(ap);
    if (!real) real = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    long result = real(number, a[0], a[1], a[2], a[3], a[4], a[5]);
    if (result == -1 && errno == EPERM && number == SYS_prlimit64 && a[2] == 0 && a[3] != 0 &&
        limits_from_proc(a[0], a[1], (struct rlimit *)a[3]) == 0) {
        errno = 0;
        return 0;
    }
    return result;
}
