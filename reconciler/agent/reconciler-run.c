/* reconciler-run: the run wrapper in C, the protocol of wrapper.py's /bin/sh script.
 *
 * Built once per state folder by cwrapper.py (named by the hash of this file); where no C
 * compiler exists the sh script is used instead. Same argv positions as the script:
 *   argv[1], argv[2]  "-c" and the protocol tag (ignored; they hold the script's place)
 *   argv[3]  "reconciler-run" (what an agent that restarts looks for)
 *   argv[4]  the run dir        argv[5]  "1": fsync the exit record
 *   argv[6]  cgroup.procs files to join, blank-separated (none: no cgroup)
 *   argv[7]  an address-space limit in KiB (empty: none)
 *   argv[8]... the command, argv[8] an absolute path
 * Unlike the script, it makes the run's log files itself: spawn_run leaves a new run's
 * RUN_DIR/stdout and RUN_DIR/stderr to it, so that creating two files (35 to 300 us each on
 * a slow disk) costs the run's process, not the agent's thread that spawns one run after
 * another. Both 0600, as every file of the run dir, and opened O_APPEND (logtrim.py cuts them
 * from the front while the run writes, and the agent may add a line to stderr).
 * Order, as in the script: catch the signals; point stdout at RUN_DIR/stdout, then stderr at
 * RUN_DIR/stderr, which closes the arming pipe spawn_run gave as stderr (a signal of the
 * agent waits for that: the files exist by then); join the
 * cgroup; set the rlimit; start the command unless a caught signal came first (then record
 * 128 + that signal instead); wait for it; ignore the signals; umask 077; write the exit code
 * and a newline to RUN_DIR/exit in one write (fsynced with argv[5] = "1"); exit with it.
 * Unlike sh, the decision to start is taken with the signals blocked and the pending ones
 * looked at, and the child is spawned with those signals at their defaults: a signal to the
 * group either stops the start or reaches the command, but for the few instructions
 * between that look and the clone inside posix_spawn. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static const int caught[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM};
#define NCAUGHT ((int)(sizeof caught / sizeof caught[0]))

static volatile sig_atomic_t noted; /* 128 + the last caught signal, 0 if none */

static void note(int sig) { noted = 128 + sig; }

/* One line on stderr, in one write. */
static void say(const char *what, const char *why) {
    char line[4200];
    int n = snprintf(line, sizeof line, "reconciler-run: %s: %s\n", what, why);
    if (n > (int)sizeof line - 1) n = (int)sizeof line - 1;
    if (n > 0 && write(2, line, (size_t)n) < 0) return;
}

static int join(const char *list) {
    char pid[24];
    int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    char path[4096];
    const char *p = list;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n') p++;
        if (!*p) return 0;
        size_t len = strcspn(p, " \t\n");
        if (len >= sizeof path) return say("cgroup path too long", p), 0;
        memcpy(path, p, len);
        path[len] = 0;
        p += len;
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
        if (fd < 0 || write(fd, pid, (size_t)n) != n) say(path, strerror(errno));
        if (fd >= 0) close(fd);
    }
}

static void limit_address_space(const char *kib) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(kib, &end, 10);
    if (errno || *end || end == kib) return say("ulimit -v", "not a number");
    struct rlimit r = {(rlim_t)v * 1024, (rlim_t)v * 1024};
    if (setrlimit(RLIMIT_AS, &r) < 0) say("ulimit -v", strerror(errno));
}

static int run(char **command, const sigset_t *mask, const sigset_t *defaults) {
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setsigmask(&attr, mask);
    posix_spawnattr_setsigdefault(&attr, defaults);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    pid_t child;
    int err = posix_spawn(&child, command[0], NULL, &attr, command, environ);
    if (err == ENOEXEC) { /* no #! line: a shell script, as sh's "$@" would run it */
        int n = 0;
        while (command[n]) n++;
        char **viash = calloc((size_t)n + 2, sizeof *viash);
        if (viash) {
            viash[0] = "/bin/sh";
            memcpy(viash + 1, command, ((size_t)n + 1) * sizeof *viash);
            err = posix_spawn(&child, "/bin/sh", NULL, &attr, viash, environ);
            free(viash);
        }
    }
    posix_spawnattr_destroy(&attr);
    if (err) {
        say(command[0], strerror(err));
        return err == ENOENT ? 127 : 126;
    }
    sigprocmask(SIG_SETMASK, mask, NULL);
    int status;
    while (waitpid(child, &status, 0) < 0)
        if (errno != EINTR) return say("waitpid", strerror(errno)), 127;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int main(int argc, char **argv) {
    if (argc < 9) return say("usage", "reconciler-run -c TAG reconciler-run RUN_DIR FSYNC CGROUPS KIB CMD..."), 2;
    struct sigaction on;
    memset(&on, 0, sizeof on);
    on.sa_handler = note;
    on.sa_flags = SA_RESTART;
    sigemptyset(&on.sa_mask);
    sigset_t set;
    sigemptyset(&set);
    for (int i = 0; i < NCAUGHT; i++) {
        sigaction(caught[i], &on, NULL);
        sigaddset(&set, caught[i]);
    }
    const char *dir = argv[4];
    char path[4096];
    if (snprintf(path, sizeof path, "%s/stdout", dir) >= (int)sizeof path) return say("run dir", "too long"), 2;
    int out_error = 0; /* said once stderr is the run's */
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0 || dup2(fd, 1) < 0) out_error = errno; /* stdout stays what spawn_run gave */
    if (fd >= 0) close(fd);
    snprintf(path, sizeof path, "%s/stderr", dir);
    fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (fd < 0 || dup2(fd, 2) < 0) close(2); /* the arming pipe closes either way */
    if (fd >= 0) close(fd);
    if (out_error) say("stdout", strerror(out_error));

    join(argv[6]);
    if (argv[7][0]) limit_address_space(argv[7]);

    sigset_t old, pending;
    sigprocmask(SIG_BLOCK, &set, &old);
    sigpending(&pending);
    for (int i = 0; i < NCAUGHT; i++)
        if (sigismember(&pending, caught[i])) noted = 128 + caught[i];
    int code = noted ? noted : run(argv + 8, &old, &set);

    struct sigaction off;
    memset(&off, 0, sizeof off);
    off.sa_handler = SIG_IGN;
    for (int i = 0; i < NCAUGHT; i++) sigaction(caught[i], &off, NULL);
    sigprocmask(SIG_SETMASK, &old, NULL);
    umask(077);
    char record[16];
    int n = snprintf(record, sizeof record, "%d\n", code);
    snprintf(path, sizeof path, "%s/exit", dir);
    int out = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (out < 0 || write(out, record, (size_t)n) != n) say(path, strerror(errno));
    if (out >= 0 && argv[5][0] == '1' && !argv[5][1]) fsync(out);
    if (out >= 0) close(out);
    return code & 255;
}
