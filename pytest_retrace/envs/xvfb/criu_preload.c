/* Preloaded into CRIU where it needs help from the machine it runs on (pytest_retrace/envs/xvfb/checkpoint.py
   builds it with the machine's C compiler). Two refusals, each answered only where it is one:

   - Root without CAP_SYS_RESOURCE (some container hosts drop it). CRIU reads each dumped process's resource
     limits with prlimit64(pid, resource, NULL, &old). The kernel lets a caller read another process's limits
     only if every uid and gid of both match or the caller has CAP_SYS_RESOURCE; the task's processes run as
     their own user, so without the capability every dump of a task failed ("Can't get rlimit 0: Operation not
     permitted"). The same numbers are in /proc/PID/limits, which anyone may read: on that one refusal, and
     only for a read, they are taken from there.
   - Kernels from 6.16 allow SO_PASSCRED and SO_PASSSEC on unix, netlink and bluetooth sockets only; CRIU 4.1
     reads both of every socket, so a TCP socket (chromium's DevTools port) failed the dump ("sockets: Can't
     get 1:16 opt: Operation not supported"; fixed in CRIU 4.2, Debian trixie has 4.1.1). Such a socket has
     neither option set, so on that refusal a read gives 0, and setting 0 succeeds, as CRIU 4.2 would. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
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

/* SO_PASSCRED or SO_PASSSEC refused for the socket's family (kernels from 6.16): the option cannot be on. */
static int refused_pass_option(int result, int level, int name) {
    return result == -1 && errno == EOPNOTSUPP && level == SOL_SOCKET && (name == SO_PASSCRED || name == SO_PASSSEC);
}

int getsockopt(int fd, int level, int name, void *value, socklen_t *length) {
    static int (*real)(int, int, int, void *, socklen_t *);
    if (!real) real = (int (*)(int, int, int, void *, socklen_t *))dlsym(RTLD_NEXT, "getsockopt");
    int result = real(fd, level, name, value, length);
    if (refused_pass_option(result, level, name) && value && length && *length >= sizeof(int)) {
        *(int *)value = 0;
        *length = sizeof(int);
        errno = 0;
        return 0;
    }
    return result;
}

int setsockopt(int fd, int level, int name, const void *value, socklen_t length) {
    static int (*real)(int, int, int, const void *, socklen_t);
    if (!real) real = (int (*)(int, int, int, const void *, socklen_t))dlsym(RTLD_NEXT, "setsockopt");
    int result = real(fd, level, name, value, length);
    if (refused_pass_option(result, level, name) && value && length >= sizeof(int) && *(const int *)value == 0) {
        errno = 0;
        return 0;
    }
    return result;
}
