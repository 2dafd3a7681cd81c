/* The CPU's multiply-add limit, measured: independent AVX-512 multiply-adds in registers,
 * no memory traffic, on N threads at once (bench/prefill_rate.py compiles and runs it).
 *
 *   mac_peak vnni THREADS SECONDS   int8 x int8 -> int32 (VPDPBUSD: 64 multiply-adds each)
 *   mac_peak fma  THREADS SECONDS   fp32 (VFMADD231PS: 16 multiply-adds each)
 *
 * Prints the multiply-adds per second of all threads together, twice: per second of wall
 * clock, and per second each thread spent on a CPU (the sum of each thread's multiply-adds
 * over its own CPU time): on a shared machine the second is what the cores can do when the
 * process has them. Twelve accumulators per thread (in registers) cover the instruction's
 * latency on two issue ports, so the loop runs at the throughput the core sustains at its
 * AVX-512 clock.
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ACCS 12
#define INNER 4096

static double seconds_per_thread;
static int use_vnni;

static double clock_s(clockid_t which) {
    struct timespec t;
    clock_gettime(which, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double now(void) { return clock_s(CLOCK_MONOTONIC); }

/* twelve named accumulators, each from its own start so that the compiler cannot merge them,
 * in registers (an array goes to memory) */
#define TWELVE(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define VNNI_DECL(j) __m512i v##j = _mm512_set1_epi32(j);
#define VNNI_STEP(j) v##j = _mm512_dpbusd_epi32(v##j, a, b);
#define VNNI_SUM(j) sink += _mm512_reduce_add_epi32(v##j);
#define FMA_DECL(j) __m512 f##j = _mm512_set1_ps((float)j);
#define FMA_STEP(j) f##j = _mm512_fmadd_ps(x, y, f##j);
#define FMA_SUM(j) sink += (long long)_mm512_reduce_add_ps(f##j);

static void *run(void *out) {
    double macs = 0, start = now(), cpu = clock_s(CLOCK_THREAD_CPUTIME_ID);
    long long sink = 0;
    if (use_vnni) {
        __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(2);
        TWELVE(VNNI_DECL)
        while (now() - start < seconds_per_thread) {
            for (int i = 0; i < INNER; i++) {
                TWELVE(VNNI_STEP)
            }
            macs += (double)INNER * ACCS * 64;
        }
        TWELVE(VNNI_SUM)
    } else {
        __m512 x = _mm512_set1_ps(1.0000001f), y = _mm512_set1_ps(0.9999999f);
        TWELVE(FMA_DECL)
        while (now() - start < seconds_per_thread) {
            for (int i = 0; i < INNER; i++) {
                TWELVE(FMA_STEP)
            }
            macs += (double)INNER * ACCS * 16;
        }
        TWELVE(FMA_SUM)
    }
    ((double *)out)[0] = macs / (now() - start);
    ((double *)out)[1] = macs / (clock_s(CLOCK_THREAD_CPUTIME_ID) - cpu);
    ((double *)out)[2] = (double)(sink & 1); /* keeps the loop's result alive */
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4 || (strcmp(argv[1], "vnni") && strcmp(argv[1], "fma"))) {
        fprintf(stderr, "usage: mac_peak vnni|fma THREADS SECONDS\n");
        return 2;
    }
    use_vnni = !strcmp(argv[1], "vnni");
    int threads = atoi(argv[2]);
    seconds_per_thread = atof(argv[3]);
    pthread_t ids[256];
    double out[256][3];
    double wall = 0, cpu = 0;
    if (threads < 1 || threads > 256) return 2;
    for (int t = 0; t < threads; t++) pthread_create(&ids[t], NULL, run, out[t]);
    for (int t = 0; t < threads; t++) {
        pthread_join(ids[t], NULL);
        wall += out[t][0];
        cpu += out[t][1];
    }
    printf("%.1f %.1f\n", wall, cpu);
    return 0;
}
