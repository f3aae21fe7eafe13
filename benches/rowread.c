/* The memory bound of a linear model's SGD step (issue 44 item 2, benches/kernels.md): how many
 * random rows of a 60,000 x 784 f32 matrix (Fashion-MNIST as bench holds it, 188 MB, far past the
 * caches) one core reads per second, in batches of 32 as bench draws them: summed (a read only)
 * and copied (a gather into a 32-row buffer, as the kernels do). svm and logreg do 4 flops a
 * feature (2 for the margin, 2 for the update) on 4 bytes read, so rows/s x 3,140 flops is their
 * ceiling on this machine, whatever the arithmetic. Rates are per CPU second of the thread, so
 * that other jobs' time slices do not count (their share of the memory bus still does).
 *
 *   cc -O2 -march=native benches/rowread.c -o /tmp/rowread && /tmp/rowread
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { N = 60000, D = 784, B = 32 };

static double clock_s(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static double now(void) { return clock_s(CLOCK_MONOTONIC); }

int main(void) {
    float *x = malloc((size_t)N * D * sizeof *x);
    int *order = malloc(N * sizeof *order);
    static float buf[B * D];
    float sink = 0;
    for (size_t i = 0; i < (size_t)N * D; i++) x[i] = (float)(i % 255) / 255.f;
    for (int i = 0; i < N; i++) order[i] = i;
    srand(1);
    for (int i = N - 1; i > 0; i--) {
        int j = rand() % (i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (int rep = 0; rep < 3; rep++) {
        for (int copy = 0; copy < 2; copy++) {
            long done = 0;
            int pos = 0;
            double t0 = now(), c0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
            while (now() - t0 < 1.0) {
                for (int k = 0; k < 10; k++, pos += B, done += B) {
                    if (pos + B > N) pos = 0;
                    for (int r = 0; r < B; r++) {
                        const float *p = x + (size_t)order[pos + r] * D;
                        if (copy) {
                            memcpy(buf + r * D, p, D * sizeof *p);
                        } else {
                            float s[16] = {0};
                            for (int j = 0; j < D; j += 16)
                                for (int l = 0; l < 16; l++) s[l] += p[j + l];
                            for (int l = 0; l < 16; l++) sink += s[l];
                        }
                    }
                    sink += buf[5];
                }
            }
            double dt = clock_s(CLOCK_THREAD_CPUTIME_ID) - c0;
            printf("%s: %.2f M rows/CPU-s, %.1f GB/s, svm/logreg ceiling %.1f GFLOP/s\n", copy ? "copy" : "read", done / dt / 1e6,
                   done * (double)D * 4 / dt / 1e9, done / dt * 4.0 * (D + 1) / 1e9);
        }
    }
    return sink == 12345.f; /* keeps the sums alive */
}
