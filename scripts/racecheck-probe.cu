/* racecheck-probe.cu: what compute-sanitizer's racecheck makes of the shared-memory hand-offs mla_wg_kernel uses, each
 * in a kernel of its own (argument 0..9), so a hazard it reports in that kernel can be told from a real race:
 *   0  a write and a read with no barrier between them: a real race, which racecheck must report (the control)
 *   1  a write, bar.sync 1, 256, then reads by the other warpgroup, with a third warpgroup already exited
 *   2  the same with the third warpgroup still running (it waits on barrier 0 at the end with everyone)
 *   3  warpgroup 0 writes, bar.arrive 2 -> warpgroup 1 bar.sync 2, reads, bar.arrive 3 -> warpgroup 0 bar.sync 3 before
 *      its next write, 8 rounds, a third warpgroup exited
 *   4  the same as 3 with 256 threads (no third warpgroup)
 *   5  the same as 3 with bar.sync on both sides of both barriers
 *   6  case 3 with warpgroup 1's read between bar.sync 2 and its own bar.sync 3 over both warpgroups
 *   7  case 5 with warpgroup 0 also syncing on barrier 4 alone (128 threads) after its write, as mla_wg's does
 *   8  case 5 with both warpgroups first waiting each round on an mbarrier the third warpgroup arrives on, and
 *      warpgroup 1 syncing on 3 at the start of its next round
 *   9  case 5 with fence.proxy.async between warpgroup 0's write and its bar.sync 2, as mla_wg's P hand-off
 *   10 case 1 with the third warpgroup giving back registers (setmaxnreg.dec to 24) before it exits, as mla_wg's
 *      producer does before its loop (sm_90a)
 *   11 case 2 (the third warpgroup alive) with the same setmaxnreg.dec
 * Cases 1..9 are ordered by the barriers (PTX: a bar.arrive or bar.sync synchronizes with the bar.sync it completes);
 * a hazard racecheck reports in them is the tool's. Build and run on the GPU machine:
 *   nvcc -gencode=arch=compute_90a,code=sm_90a -o racecheck-probe scripts/racecheck-probe.cu
 *   for k in 0 1 2 3 4 5 6 7 8 9 10 11; do compute-sanitizer --tool racecheck ./racecheck-probe $k; done
 * Exit 0 when the kernel ran and its reads saw the values written (so the orderings held on the device), 1 otherwise.
 * What the H200 gave (cases 0..6 from this file's first version, the same code paths; 7..11 from later ones): MEASURED.md
 * (issue 31, racecheck). */
#include <cstdint>
#include <cstdio>
#include <cstdlib>

__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }

__global__ void __launch_bounds__(384, 1) probe(int kase, int *bad) {
    __shared__ volatile float x[64];
    const int tid = threadIdx.x, w = tid >> 7;
    if (kase == 0) {
        if (tid < 64) x[tid] = 1.0f;
        if (tid >= 128 && tid < 192 && x[tid - 128] != 1.0f && x[tid - 128] != 0.0f) atomicAdd(bad, 1);
        return;
    }
    if (kase == 1 || kase == 2 || kase == 10 || kase == 11) {
        if (w == 2) {
            if (kase >= 10) asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
            if (kase == 2 || kase == 11) __syncthreads();
            return;
        }
        if (w == 0 && tid < 64) x[tid] = (float)tid;
        bar_sync(1, 256);
        if (w == 1 && tid - 128 < 64 && x[tid - 128] != (float)(tid - 128)) atomicAdd(bad, 1);
        if (kase == 2 || kase == 11) __syncthreads();
        return;
    }
    __shared__ uint64_t mbar;
    const uint32_t mb = (uint32_t)__cvta_generic_to_shared(&mbar);
    if (kase == 8) {
        if (tid == 0) asm volatile("mbarrier.init.shared::cta.b64 [%0], 128;\n" ::"r"(mb) : "memory");
        __syncthreads();
    }
    const bool full = kase == 5 || kase >= 7; /* bar.sync on both sides of both barriers */
    if (w == 2) { /* cases 3..7 and 9: the third warpgroup exits at once; case 8: it arrives once a round first */
        for (int k = 0; kase == 8 && k < 8; k++) {
            asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(mb) : "memory");
            bar_sync(5, 384); /* the round's waits done before the next phase's arrivals */
        }
        return;
    }
    for (int k = 0; k < 8; k++) {
        if (kase == 8)
            asm volatile("{\n .reg .pred p;\n W:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}\n" ::"r"(mb),
                         "r"(k & 1)
                         : "memory");
        if (w == 0) {
            if (k > 0) bar_sync(3, 256);
            if (tid < 64) x[tid] = (float)(k * 64 + tid);
            if (kase == 9) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            if (full) bar_sync(2, 256);
            else bar_arrive(2, 256);
            if (kase == 7) bar_sync(4, 128);
        } else {
            if (kase == 8 && k > 0) bar_sync(3, 256); /* the last round's release, at this round's start (mla_wg's) */
            bar_sync(2, 256);
            if (tid - 128 < 64 && x[tid - 128] != (float)(k * 64 + tid - 128)) atomicAdd(bad, 1);
            if (kase != 8) {
                if (full || kase == 6) bar_sync(3, 256);
                else bar_arrive(3, 256);
            }
        }
        if (kase == 8) bar_sync(5, 384);
    }
    if (w == 0 || kase == 8) bar_sync(3, 256); /* warpgroup 1's last release */
}

int main(int argc, char **argv) {
    const int kase = argc > 1 ? atoi(argv[1]) : -1;
    if (kase < 0 || kase > 11) {
        fprintf(stderr, "usage: racecheck-probe CASE (0..11)\n");
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
