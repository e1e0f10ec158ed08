// How long a busy thread goes without running on this machine: each thread reads
// CLOCK_MONOTONIC in a tight loop for S seconds and counts the gaps between
// consecutive reads above 0.2 / 0.5 / 1 / 2 ms (time it was not on a core: the
// scheduler ran something else, or the hypervisor took the vCPU), its worst gap and
// the share of the time lost in gaps over 0.1 ms. With as many busy threads as cores
// the gaps are what nothing in this process can avoid; with one more thread than
// cores they are the scheduler's time slices. scripts/vm_jitter.sh runs it.
// Usage: vm_jitter THREADS SECONDS
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double seconds = 5;

struct result {
  long over[4];
  double worst, lost;
};

static void* spin(void* arg) {
  struct result* r = arg;
  static const double th[4] = {0.2e-3, 0.5e-3, 1e-3, 2e-3};
  const double t0 = now();
  double last = t0;
  for (;;) {
    const double t = now(), g = t - last;
    last = t;
    if (g > 0.1e-3) r->lost += g;
    for (int i = 0; i < 4; ++i) r->over[i] += g > th[i];
    if (g > r->worst) r->worst = g;
    if (t - t0 > seconds) break;
  }
  return NULL;
}

int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 1;
  seconds = argc > 2 ? atof(argv[2]) : 5;
  if (n < 1 || n > 256 || seconds <= 0) {
    fprintf(stderr, "usage: vm_jitter THREADS(1-256) SECONDS(>0)\n");
    return 2;
  }
  pthread_t th[256];
  struct result res[256] = {{{0}}};
  for (int i = 0; i < n; ++i) pthread_create(&th[i], NULL, spin, &res[i]);
  for (int i = 0; i < n; ++i) pthread_join(th[i], NULL);
  for (int i = 0; i < n; ++i)
    printf("threads %d, thread %d, %.0f s: gaps >0.2 ms %ld, >0.5 ms %ld, >1 ms %ld, >2 ms %ld; worst %.2f ms; "
           "%.2f%% of the time in gaps >0.1 ms\n",
           n, i, seconds, res[i].over[0], res[i].over[1], res[i].over[2], res[i].over[3], res[i].worst * 1e3,
           100 * res[i].lost / seconds);
  return 0;
}
