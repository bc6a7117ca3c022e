/* Reference for `pipelock run pipe-throughput --passes 1`: UnixBench's pipe.c
 * loop (write 512; read 512; count++) until SIGALRM. Prints lps. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t stop;
static void on_alarm(int sig) { (void)sig; stop = 1; }

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 10.0;
    int fd[2];
    char buf[512] = {0};
    unsigned long count = 0;
    struct sigaction sa = {0};
    struct itimerval it = {0};
    struct timespec t0, t1;
    if (pipe(fd)) return 1;
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, NULL);
    it.it_value.tv_sec = (time_t)secs;
    it.it_value.tv_usec = (suseconds_t)((secs - (double)(time_t)secs) * 1e6);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    setitimer(ITIMER_REAL, &it, NULL);
    while (!stop) {
        if (write(fd[1], buf, sizeof buf) != sizeof buf) break;
        if (read(fd[0], buf, sizeof buf) != sizeof buf) break;
        count++;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%.1f\n", count / ((t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9));
    return 0;
}
