/* The variadic exec functions, execl, execle and execlp, for libsmc_preload.so.
 *
 * The C library's own execl* call execve (or its execvpe) inside the library, where a
 * preload cannot see the call, so without these a program that execs with them would drop
 * its SMC connections instead of handing them to a keeper (src/exec.rs). Stable Rust cannot
 * define a C-variadic function, so these gather the arguments into an argv array, as the C
 * library does, and call the vector forms, which are the library's hooks (exported from the
 * same object: the call below binds to them). The exported names are Rust naked functions
 * that jump here (src/hooks.rs, "exec"), since a cdylib exports only Rust's symbols.
 */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <unistd.h>

/* Past this many arguments execve fails with E2BIG anyway; the array is on the stack. */
#define SMC_MAX_ARGS 65536

/* Counts the arguments after `arg` up to the NULL; -1 when there are too many. */
static long count_args(const char *arg, va_list ap) {
    long n = 0;
    if (arg == NULL)
        return 0;
    n = 1;
    while (va_arg(ap, const char *) != NULL) {
        if (++n >= SMC_MAX_ARGS)
            return -1;
    }
    return n;
}

#define GATHER(arg, last, argv, n)                       \
    do {                                                 \
        va_list ap2;                                     \
        va_start(ap2, last);                             \
        (argv)[0] = (arg);                               \
        for (long i = 1; i <= (n); i++)                  \
            (argv)[i] = va_arg(ap2, char *);             \
        envp_out = va_arg(ap2, char *const *);           \
        va_end(ap2);                                     \
    } while (0)

__attribute__((visibility("hidden"))) int smc_preload_execl(const char *path, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    long n = count_args(arg, ap);
    va_end(ap);
    if (n < 0) {
        errno = E2BIG;
        return -1;
    }
    char *argv[n + 1];
    char *const *envp_out;
    GATHER((char *)arg, arg, argv, n);
    (void)envp_out;
    return execv(path, argv);
}

__attribute__((visibility("hidden"))) int smc_preload_execlp(const char *file, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    long n = count_args(arg, ap);
    va_end(ap);
    if (n < 0) {
        errno = E2BIG;
        return -1;
    }
    char *argv[n + 1];
    char *const *envp_out;
    GATHER((char *)arg, arg, argv, n);
    (void)envp_out;
    return execvp(file, argv);
}

__attribute__((visibility("hidden"))) int smc_preload_execle(const char *path, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    long n = count_args(arg, ap);
    va_end(ap);
    if (n < 0) {
        errno = E2BIG;
        return -1;
    }
    char *argv[n + 1];
    char *const *envp_out;
    GATHER((char *)arg, arg, argv, n);
    return execve(path, argv, envp_out);
}
