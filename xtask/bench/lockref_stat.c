/* Reference for `pipelock run lockref-stat --threads N`: N threads stat() one
 * shared file until a timer fires. Usage: lockref_stat THREADS SECS PATH.
 * Prints ops/s. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t stop;
static const char *path;
static void on_alarm(int sig) { (void)sig; stop = 1; }

static void *storm(void *arg) {
    struct stat st;
    unsigned long *count = arg;
    while (!stop && stat(path, &st) == 0) (*count)++;
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    double secs = argc > 2 ? atof(argv[2]) : 10.0;
    path = argc > 3 ? argv[3] : "/tmp";
    pthread_t tid[4096];
    unsigned long counts[4096] = {0}, total = 0;
    struct sigaction sa = {0};
    struct itimerval it = {0};
    struct timespec t0, t1;
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, NULL);
    it.it_value.tv_sec = (time_t)secs;
    it.it_value.tv_usec = (suseconds_t)((secs - (double)(time_t)secs) * 1e6);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    setitimer(ITIMER_REAL, &it, NULL);
    for (int i = 0; i < threads; i++) pthread_create(&tid[i], NULL, storm, &counts[i]);
    for (int i = 0; i < threads; i++) { pthread_join(tid[i], NULL); total += counts[i]; }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%.1f\n", total / ((t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9));
    return 0;
}
