/* Value-checked MPI_Allreduce, compiled in the image with its own mpicc.
 * Two sizes: one int (latency path) and 1 Mi doubles = 8 MiB (the large-message
 * shared-memory / network path). Every element is checked on every rank.
 * Prints one line per rank: TBCONF {"rank":..,"size":..,"host":..,"ok":..,"bad":..}
 * and exits 1 on any wrong value. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define N (1 << 20)

int main(int argc, char **argv) {
    int rank, size, bad = 0;
    char host[256] = "";
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    gethostname(host, sizeof host - 1);

    int one = rank + 1, sum = 0;
    MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (sum != size * (size + 1) / 2) bad++;

    double *in = malloc(N * sizeof *in), *out = malloc(N * sizeof *out);
    if (!in || !out) { fprintf(stderr, "out of memory\n"); MPI_Abort(MPI_COMM_WORLD, 2); }
    for (int i = 0; i < N; i++) { in[i] = rank + 1 + (double)(i % 1000); out[i] = -1; }
    MPI_Allreduce(in, out, N, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    for (int i = 0; i < N; i++) {
        double want = size * (size + 1) / 2.0 + (double)size * (i % 1000);
        if (out[i] != want) bad++;
    }

    /* A point-to-point ring of the same buffer: the single-copy (CMA) path in shared memory. */
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    MPI_Sendrecv(in, N, MPI_DOUBLE, next, 7, out, N, MPI_DOUBLE, prev, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    for (int i = 0; i < N; i += 997)
        if (out[i] != prev + 1 + (double)(i % 1000)) bad++;

    int allbad = 0;
    MPI_Allreduce(&bad, &allbad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    printf("TBCONF {\"probe\":\"c\",\"rank\":%d,\"size\":%d,\"host\":\"%s\",\"sum\":%d,\"bad\":%d,\"ok\":%s}\n",
           rank, size, host, sum, bad, allbad == 0 ? "true" : "false");
    fflush(stdout);
    free(in); free(out);
    MPI_Finalize();
    return allbad == 0 ? 0 : 1;
}
