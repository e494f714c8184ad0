/* reconciler-run: the run wrapper in C, the protocol of wrapper.py's /bin/sh script.
 *
 * Built once per state folder by cwrapper.py (named by the hash of this file); where no C
 * compiler exists the sh script is used instead. Same argv positions as the script:
 *   argv[1], argv[2]  "-c" and the protocol tag (ignored; they hold the script's place)
 *   argv[3]  "reconciler-run" (what an agent that restarts looks for)
 *   argv[4]  the run dir        argv[5]  "1": fsync the exit record
 *   argv[6]  cgroup files to join (cgroup.procs, or v1's tasks), blank-separated (none: no cgroup)
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
 * and a newline to RUN_DIR/exit in one write, its mtime then set to the moment the command's
 * end was seen (a file's own mtime comes from the kernel's coarse clock, up to a tick early);
 * fsynced with argv[5] = "1"; exit with it.
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
#include <time.h>
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

/* Each path is a cgroup's `cgroup.procs` (written this process's pid) or, on cgroup v1, its
 * `tasks` (written 0: this thread, the only one, moved without the kernel's lock on every
 * migration, which waits for an RCU grace period after a quiet spell). */
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
        const char *base = strrchr(path, '/');
        int self = base != NULL && strcmp(base + 1, "tasks") == 0; /* as the script's case pattern */
        const char *value = self ? "0\n" : pid;
        size_t size = self ? 2 : (size_t)n;
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
        if (fd < 0 || write(fd, value, size) != (ssize_t)size) say(path, strerror(errno));
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

/* The signals a run's group may be sent, caught: noted, so the command is not started or
 * its end is recorded, never the wrapper killed before it records. */
static void trap_signals(sigset_t *set) {
    struct sigaction on;
    memset(&on, 0, sizeof on);
    on.sa_handler = note;
    on.sa_flags = SA_RESTART;
    sigemptyset(&on.sa_mask);
    sigemptyset(set);
    for (int i = 0; i < NCAUGHT; i++) {
        sigaction(caught[i], &on, NULL);
        sigaddset(set, caught[i]);
    }
}

/* The run itself, with the signals trapped: logs, cgroup, rlimit, the command (from `cwd`
 * unless NULL: an exec'd wrapper was started there), the exit record. Returns the exit code. */
static int wrap(const char *dir, const char *fsync_flag, const char *cgroups, const char *kib, char **command,
                const sigset_t *set, const char *cwd) {
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

    join(cgroups);
    if (kib[0]) limit_address_space(kib);

    sigset_t old, pending;
    sigprocmask(SIG_BLOCK, set, &old);
    sigpending(&pending);
    for (int i = 0; i < NCAUGHT; i++)
        if (sigismember(&pending, caught[i])) noted = 128 + caught[i];
    int code = noted;
    if (!code && cwd && chdir(cwd) < 0) { /* spawn_run saw it there; gone since: as sh's cd */
        say(cwd, strerror(errno));
        code = 127;
    }
    if (!code) code = run(command, &old, set);
    struct timespec ended[2]; /* atime and mtime: the record says when the command ended */
    clock_gettime(CLOCK_REALTIME, &ended[0]);
    ended[1] = ended[0];

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
    if (out >= 0) futimens(out, ended); /* after the write, which stamps the coarse time */
    if (out >= 0 && fsync_flag[0] == '1' && !fsync_flag[1]) fsync(out);
    if (out >= 0) close(out);
    return code & 255;
}

/* Fork-server mode, `reconciler-run --serve LOCKFD reconciler-run-server PAD`: one long-lived
 * process per agent that starts every run as a forked copy of itself, which then is that
 * run's wrapper exactly as above. The agent's thread writes a request and reads one line;
 * the fork, the new session, the log files and the command's spawn are this process's and
 * the copy's work, on another core, not the agent's. A copy is a process per run as before:
 * its death loses its own run's status only, and this server's death loses none (the copies
 * are reparented and go on; the agent starts another server).
 * Request on stdin: a 4-byte length in host order, then NUL-terminated fields: RUN_DIR,
 * FSYNC, CGROUPS, KIB, CWD, the number of environment entries N, N entries, the command.
 * Reply on stdout, written by the server right after the fork: "PID STARTTIME\n" (STARTTIME
 * in clock ticks since boot, /proc/PID/stat's field 22, read before the copy can be reaped),
 * or "! reason\n" when it could not fork (nothing is run then). The copy calls setsid first
 * and has the signals it traps blocked from the fork until it has trapped them.
 * The copy rewrites its command line to the wrapper's first five words
 * (`reconciler-run -c - reconciler-run RUN_DIR`) in the room PAD leaves, so an agent that
 * restarts finds it as it finds an exec'd wrapper. Ends at EOF on stdin.
 * LOCKFD (inherited) holds an flock the agent took for this server: the server holds it for
 * its life and each copy until it leads its session under its new title, so an agent that
 * restarts and finds the lock free knows every run its predecessor asked for can be found. */
static int read_full(int fd, char *buf, size_t n) {
    while (n) {
        ssize_t got = read(fd, buf, n);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return -1;
        buf += got;
        n -= (size_t)got;
    }
    return 0;
}

static void reply(const char *line) {
    size_t n = strlen(line);
    while (write(1, line, n) < 0 && errno == EINTR) {
    }
}

static void refuse(const char *what, int err) {
    char line[512];
    snprintf(line, sizeof line, "! %s: %s\n", what, strerror(err));
    reply(line);
}

/* A process's start in clock ticks since boot, as /proc/PID/stat says it (0: unknown). */
static unsigned long long start_ticks(pid_t pid) {
    char buf[1024];
    snprintf(buf, sizeof buf, "/proc/%d/stat", (int)pid);
    int fd = open(buf, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p) return 0;
    p += 2; /* the state letter: field 3 */
    for (int field = 3; field < 22 && *p; field++) {
        p = strchr(p, ' ');
        if (!p) return 0;
        p++;
    }
    return strtoull(p, NULL, 10);
}

/* The command line from argv[1] on, in the room the server's own left: "-c - reconciler-run
 * RUN_DIR", as an exec'd wrapper's (argv[0], this binary's path, stays). */
static void retitle(char *area, char *area_end, const char *dir) {
    static const char head[] = "-c\0-\0reconciler-run";
    char *p = area + strlen(area) + 1;
    /* never: forkserver.py sizes PAD by the state folder; else the copy would not be found */
    if (sizeof head + strlen(dir) + 1 > (size_t)(area_end - p)) return;
    memset(p, 0, (size_t)(area_end - p));
    memcpy(p, head, sizeof head);
    memcpy(p + sizeof head, dir, strlen(dir));
}

static void start_copy(char *body, size_t size, char **argv, char *area_end, int lock) {
    char *field[6];
    char *p = body, *end = body + size;
    for (int i = 0; i < 6; i++) {
        field[i] = p;
        p = memchr(p, 0, (size_t)(end - p));
        if (!p) return refuse("request", EINVAL);
        p++;
    }
    long nenv = strtol(field[5], NULL, 10);
    size_t count = 0;
    for (char *q = p; q < end; q += strlen(q) + 1) count++;
    if (nenv < 0 || (size_t)nenv >= count) return refuse("request", EINVAL);
    char **list = calloc(count + 2, sizeof *list);
    if (!list) return refuse("request", ENOMEM);
    size_t i = 0;
    for (char *q = p; q < end; q += strlen(q) + 1) list[i + (i >= (size_t)nenv)] = q, i++;
    char **envp = list, **command = list + nenv + 1; /* envp NULL-terminated at list[nenv] */

    sigset_t set, prev;
    sigemptyset(&set);
    for (int k = 0; k < NCAUGHT; k++) sigaddset(&set, caught[k]);
    sigaddset(&set, SIGCHLD);
    /* blocked across the fork: the copy is not reaped before its start time is read, and the
     * copy starts with the signals it will trap blocked, pending until trapped */
    sigprocmask(SIG_BLOCK, &set, &prev);
    pid_t pid = fork();
    if (pid != 0) {
        if (pid < 0) refuse("fork", errno);
        char line[64];
        if (pid > 0) snprintf(line, sizeof line, "%d %llu\n", (int)pid, start_ticks(pid));
        if (pid > 0) reply(line);
        sigprocmask(SIG_SETMASK, &prev, NULL);
        free(list);
        return;
    }
    /* The copy: the caught signals and SIGCHLD are blocked (see above) until trapped, reset. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    setsid(); /* first: the agent's signals to the run's group wait for it (forkserver.py) */
    sigaction(SIGCHLD, &dfl, NULL); /* the server's handler reaps copies; this one waits for its command */
    retitle(argv[0], area_end, field[0]);
    if (lock >= 0) close(lock); /* found as a wrapper from now on */
    sigset_t trapped;
    trap_signals(&trapped);
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null >= 0) {
        dup2(null, 0);
        dup2(null, 1); /* the reply pipe no longer: wrap() points stdout at the run's file */
        close(null);
    }
    environ = envp;
    sigprocmask(SIG_UNBLOCK, &set, NULL); /* a signal pending since the fork is noted now; SIGCHLD too */
    _exit(wrap(field[0], field[1], field[2], field[3], command, &trapped, field[4]));
}

/* Copies are reaped as they end: their records are their files. */
static void reap_copies(int sig) {
    (void)sig;
    int saved = errno;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved;
}

static int serve(char **argv, char *area_end) {
    int lock = strcmp(argv[2], "-") == 0 ? -1 : atoi(argv[2]);
    struct sigaction reaper;
    memset(&reaper, 0, sizeof reaper);
    reaper.sa_handler = reap_copies;
    reaper.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigemptyset(&reaper.sa_mask);
    sigaction(SIGCHLD, &reaper, NULL);
    for (;;) {
        unsigned int size;
        if (read_full(0, (char *)&size, sizeof size) < 0) return 0; /* the agent is gone or done */
        if (size > (1u << 26)) return say("request", "too large"), 2; /* forkserver.py never sends one */
        char *body = malloc((size_t)size + 1);
        if (!body) return say("request", strerror(ENOMEM)), 2;
        if (read_full(0, body, size) < 0) return free(body), 0;
        body[size] = 0;
        start_copy(body, size, argv, area_end, lock);
        free(body);
    }
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "--serve") == 0) return serve(argv, argv[argc - 1] + strlen(argv[argc - 1]) + 1);
    if (argc < 9) return say("usage", "reconciler-run -c TAG reconciler-run RUN_DIR FSYNC CGROUPS KIB CMD..."), 2;
    sigset_t set;
    trap_signals(&set);
    return wrap(argv[4], argv[5], argv[6], argv[7], argv + 8, &set, NULL);
}
