/* racecheck-probe.cu: what compute-sanitizer's racecheck makes of the shared-memory hand-offs mla_wg_kernel uses, each
 * in a kernel of its own (argument 0..6), so a hazard it reports in that kernel can be told from a real race:
 *   0  a write and a read with no barrier between them: a real race, which racecheck must report (the control)
 *   1  a write, bar.sync 1, 256, then reads by the other warpgroup, with a third warpgroup already exited
 *   2  the same with the third warpgroup still running (it waits on barrier 0 at the end with everyone)
 *   3  warpgroup 0 writes, bar.arrive 2 -> warpgroup 1 bar.sync 2, reads, bar.arrive 3 -> warpgroup 0 bar.sync 3 before
 *      its next write, 8 rounds, a third warpgroup exited
 *   4  the same as 3 with 256 threads (no third warpgroup)
 *   5  the same as 3 with bar.sync on both sides of both barriers
 *   6  case 3 with warpgroup 1's read between bar.sync 2 and its own bar.sync 3 over both warpgroups
 * Cases 1..6 are ordered by the barriers (PTX: a bar.arrive or bar.sync synchronizes with the bar.sync it completes);
 * a hazard racecheck reports in them is the tool's. Build and run on the GPU machine:
 *   nvcc -arch=sm_90 -o racecheck-probe scripts/racecheck-probe.cu
 *   for k in 0 1 2 3 4 5 6; do compute-sanitizer --tool racecheck ./racecheck-probe $k; done
 * Exit 0 when the kernel ran and its reads saw the values written (so the orderings held on the device), 1 otherwise.
 * What the H200 gave: MEASURED.md (issue 31, racecheck). */
#include <cstdio>
#include <cstdlib>

__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }

__global__ void probe(int kase, int *bad) {
    __shared__ volatile float x[64];
    const int tid = threadIdx.x, w = tid >> 7;
    if (kase == 0) {
        if (tid < 64) x[tid] = 1.0f;
        if (tid >= 128 && tid < 192 && x[tid - 128] != 1.0f && x[tid - 128] != 0.0f) atomicAdd(bad, 1);
        return;
    }
    if (kase == 1 || kase == 2) {
        if (w == 2) {
            if (kase == 2) __syncthreads();
            return;
        }
        if (w == 0 && tid < 64) x[tid] = (float)tid;
        bar_sync(1, 256);
        if (w == 1 && tid - 128 < 64 && x[tid - 128] != (float)(tid - 128)) atomicAdd(bad, 1);
        if (kase == 2) __syncthreads();
        return;
    }
    if (w == 2) return; /* cases 3, 5, 6: the third warpgroup exits at once */
    for (int k = 0; k < 8; k++) {
        if (w == 0) {
            if (k > 0) bar_sync(3, 256);
            if (tid < 64) x[tid] = (float)(k * 64 + tid);
            if (kase == 5) bar_sync(2, 256);
            else bar_arrive(2, 256);
        } else {
            bar_sync(2, 256);
            if (tid - 128 < 64 && x[tid - 128] != (float)(k * 64 + tid - 128)) atomicAdd(bad, 1);
            if (kase == 5 || kase == 6) bar_sync(3, 256);
            else bar_arrive(3, 256);
        }
    }
    if (w == 0) bar_sync(3, 256); /* warpgroup 1's last arrival */
}

int main(int argc, char **argv) {
    const int kase = argc > 1 ? atoi(argv[1]) : -1;
    if (kase < 0 || kase > 6) {
        fprintf(stderr, "usage: racecheck-probe CASE (0..6)\n");
        return 2;
    }
    int *bad = nullptr, nbad = 0;
    if (cudaMalloc(&bad, sizeof(int)) != cudaSuccess || cudaMemset(bad, 0, sizeof(int)) != cudaSuccess) return 1;
    probe<<<1, kase == 4 ? 256 : 384>>>(kase, bad);
    const cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess || cudaMemcpy(&nbad, bad, sizeof(int), cudaMemcpyDeviceToHost) != cudaSuccess) {
        fprintf(stderr, "case %d: %s\n", kase, cudaGetErrorString(e));
        return 1;
    }
    printf("case %d: %d wrong reads\n", kase, nbad);
    return nbad != 0;
}
