/* bench/harness/hardware.h: a GPU system as the capacity planner sees it, read
 * from a hardware file (results/hardware/NAME; the format is documented in
 * results/hardware/README.md), and the unit costs the time model asks of it:
 * a GEMM at its shape's efficiency, a memory-bound kernel at HBM bandwidth, and
 * a collective by the alpha-beta model over the links its group spans.
 *
 * It is not the time model (bench/harness/timemodel.h composes these into a
 * step) and it runs nothing. Every number in a shipped file cites its public
 * source or the command that measured it.
 */
#ifndef SB_HARDWARE_H
#define SB_HARDWARE_H

#include <stddef.h>
#include <stdint.h>

/* The dtypes a hardware file rates: bf16, fp8, f32 (index into peak_flops). */
enum { SB_HW_BF16 = 0, SB_HW_FP8 = 1, SB_HW_F32 = 2, SB_HW_NDTYPES = 3 };
/* Most points of a GEMM efficiency table. */
enum { SB_HW_MAX_GEMM_PTS = 32 };
/* NCCL's algorithms the collective model knows. */
typedef enum sb_hw_algo { SB_HW_RING = 0, SB_HW_TREE = 1 } sb_hw_algo;

/* One point of the GEMM efficiency curve: GEMMs of about `flops` (2 m n k per
 * call) reach `eff` of the dtype's peak (interpolated in log flops between
 * points, clamped at the ends). */
typedef struct sb_hw_gemm_pt {
  double flops;
  double eff;
} sb_hw_gemm_pt;

typedef struct sb_hw {
  char name[64];                   /* the file's base name ("h100-sxm-80gb") */
  char path[1024];                 /* where it was read */
  char *text;                      /* the whole file (malloc'd; stored with predictions) */
  double peak_flops[SB_HW_NDTYPES]; /* dense FLOP/s per dtype; 0: not rated */
  double hbm_bytes;                /* HBM capacity per GPU, bytes */
  double hbm_bw;                   /* HBM bandwidth per GPU, B/s */
  double hbm_eff;                  /* fraction of hbm_bw memory-bound kernels reach */
  int gpus_per_node;
  double intra_bw, intra_lat;      /* per GPU, one direction: B/s and s (NVLink) */
  double inter_bw, inter_lat;      /* per GPU, one direction: B/s and s (IB / RoCE) */
  int n_gemm[SB_HW_NDTYPES];       /* GEMM efficiency table per dtype */
  sb_hw_gemm_pt gemm[SB_HW_NDTYPES][SB_HW_MAX_GEMM_PTS];
  double attn_eff[SB_HW_NDTYPES];  /* fraction of peak a fused attention kernel reaches
                                    * (FlashAttention forward + backward); 0: not rated */
  double kernel_s;                 /* the least time of a kernel launch (0: none) */
  int shared_cores;                /* a host's cores the ranks of a node share (the local
                                    * file: threads ranks on a CPU); 0: each GPU its own */
  double alloc_overhead;           /* fraction of the peak the caching allocator adds */
  double reserved_bytes;           /* memory the runtime reserves (CUDA context, NCCL, workspace) */
  double coll_base_lat;            /* s added once per collective call (NCCL's baseLat) */
} sb_hw;

/* Reads the hardware file `name` (a name: DIR/NAME under the data dir's
 * results/hardware/ as bench/harness/datadir.h finds it; a path with a '/':
 * that file). 0, or -1 with "FILE:LINE: reason" (one line) in err and *hw left
 * empty (nothing to free). */
int sb_hw_load(const char *name, sb_hw *hw, char *err, size_t errn);
void sb_hw_free(sb_hw *hw);
/* The dtype index of "bf16", "fp8", "f32" (also "f64" -> f32's), -1 otherwise. */
int sb_hw_dtype(const char *dtype);

/* Seconds of batch GEMMs [m x k] x [k x n] of dtype dt (an SB_HW_* index). */
double sb_hw_gemm_s(const sb_hw *hw, int dt, int64_t m, int64_t n, int64_t k, int64_t batch);
/* Seconds of a memory-bound kernel moving `bytes` (read + written). */
double sb_hw_mem_s(const sb_hw *hw, double bytes);
/* Seconds of one collective `op` (dt_coll_name: "all_reduce", "all_gather",
 * "reduce_scatter", "broadcast", "reduce", "all_to_all", "send", "recv", ...) of
 * payload S = `bytes` (dt_ledger_row.payload_bytes: the full tensor of the
 * nccl-tests convention) over a group of n ranks, `per_node` of which share a
 * node (n / per_node nodes; per_node == n: all NVLink), with NCCL's ring or tree
 * algorithm (alpha-beta: latency per step plus the bus factor times S over the
 * slowest link's bandwidth; nccl-tests doc/PERFORMANCE.md). */
double sb_hw_coll_s(const sb_hw *hw, const char *op, double bytes, int n, int per_node,
                    sb_hw_algo algo);
/* The faster of ring and tree for that call (what NCCL's tuner picks, roughly). */
double sb_hw_coll_best_s(const sb_hw *hw, const char *op, double bytes, int n, int per_node);

#endif
