/* Reference for `pipelock run pipe-herd`: the test program of Linux commit
 * 0ddad21d3e99, with a subreaper parent that times until every member exits.
 * Usage: pipe_herd K LIMIT. Prints seconds. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int k = argc > 1 ? atoi(argv[1]) : 6;
    int limit = argc > 2 ? atoi(argv[2]) : 1000000;
    int fd[2], counters[2] = {0, -1};
    struct timespec t0, t1;
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    if (pipe(fd)) return 1;
    if (write(fd[1], counters, sizeof counters) != sizeof counters) return 1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (fork() == 0) {
        for (int i = 0; i < k; i++) fork();
        do {
            int i;
            if (read(fd[0], &i, sizeof i) != sizeof i) _exit(1);
            if (i < 0) continue;
            counters[0] = i + 1;
            if (write(fd[1], counters, (1 + (i & 1)) * sizeof(int)) < 0) _exit(1);
        } while (counters[0] < limit);
        _exit(0);
    }
    close(fd[0]);
    close(fd[1]);
    while (wait(NULL) > 0) {}
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%.6f\n", (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
    return 0;
}
