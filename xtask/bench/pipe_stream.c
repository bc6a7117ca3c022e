/* Reference for `pipelock run pipe-stream --bytes N`: a source writing 128 KiB
 * chunks into a pipe, a middle process buffering BUFSIZE bytes to /dev/null.
 * Usage: pipe_stream BYTES BUFSIZE. Prints MiB/s. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (128 * 1024)

int main(int argc, char **argv) {
    unsigned long long bytes = argc > 1 ? strtoull(argv[1], 0, 10) : (1ULL << 30);
    size_t bufsize = argc > 2 ? strtoul(argv[2], 0, 10) : 819200;
    int fd[2];
    struct timespec t0, t1;
    if (pipe(fd)) return 1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (fork() == 0) {
        static char buf[CHUNK];
        unsigned long long sent = 0;
        close(fd[0]);
        memset(buf, 0x5a, sizeof buf);
        while (sent < bytes) {
            size_t want = bytes - sent < CHUNK ? bytes - sent : CHUNK;
            ssize_t n = write(fd[1], buf, want);
            if (n <= 0) _exit(1);
            sent += n;
        }
        _exit(0);
    }
    if (fork() == 0) {
        char *buf = malloc(bufsize);
        int sink = open("/dev/null", O_WRONLY);
        close(fd[1]);
        for (;;) {
            size_t filled = 0;
            while (filled < bufsize) {
                ssize_t n = read(fd[0], buf + filled, bufsize - filled);
                if (n <= 0) break;
                filled += n;
            }
            if (filled == 0 || write(sink, buf, filled) != (ssize_t)filled) _exit(0);
        }
    }
    close(fd[0]);
    close(fd[1]);
    while (wait(NULL) > 0) {}
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%.3f\n", bytes / ((t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9) / 1048576.0);
    return 0;
}
