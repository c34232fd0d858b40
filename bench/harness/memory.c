/* bench/harness/memory.c: how much memory a config will take, estimated before any
 * work, and how much the machine has (declared in bench/harness/store.h).
 *
 * Per rank (the quantity results.peak_mem_bytes measures: the library's
 * high-water mark of host bytes a rank allocated, ctx->mem.host_peak):
 *
 *   weights: every module weight of the Llama (lib/nn's dt_llama_module_at:
 *     tok_embeddings V x D; per layer attention_norm D, wq QD x D, wk and wv
 *     KVD x D, wo D x QD, ffn_norm D, w1 and w3 F x D, w2 D x F; norm D; output
 *     V x D), split over tp when a [tp]
 *     ColwiseParallel/RowwiseParallel entry of the plan matches its fqn, whole
 *     otherwise; held 4 times (the weight, its gradient, AdamW's exp_avg and
 *     exp_avg_sq: torch.optim.AdamW keeps two moments per parameter), plus one
 *     more of the largest local weight for a transient (the update's temporary);
 *     beside the activations only the weights and gradients when the run is one step
 *     (AdamW makes its moments in the optimizer step, after backward), and the
 *     larger of the two phases counts.
 *   data parallel (dp_replicate or cp > 1, no FSDP): the flat buffer of one DDP gradient bucket
 *     (lib/parallel dt_data_parallel_reduce_grads, one bucket at a time): a
 *     bucket closes once it reaches its cap, so it holds less than the cap
 *     (the plan's bucket_cap_mb, else DDP's 25 MiB) plus its last gradient,
 *     and at most every local weight.
 *   FSDP: 3 copies of the largest unit (a layer's local weights, or the largest
 *     weight: the unit's gathered parameters, its unsharded gradient and the
 *     reduce-scatter's input live together during its backward).
 *   activations, per token on the rank (batch / dp_replicate x seq / cp: attention is
 *     a flash-style kernel that keeps one logsumexp per head and token, no
 *     seq x seq scores, so nothing grows with seq^2), as the tape keeps them: a
 *     value lives while a backward still to come reads it (lib/autograd's
 *     lifetimes, PyTorch's saved tensors). Per layer 4 D that no TP plan splits
 *     (the gathered inputs of the column-parallel projections, the residuals h1 and
 *     the block's output) plus 5 D + 3 F that TP splits when the layer's
 *     projections are sharded (rope'd q and k, the viewed v, the attention output
 *     and its reshape; w1's, w3's and swiglu's outputs); once, the backward's
 *     transients of one layer (4 D + 3 F / tp: the gathered input's partial
 *     gradient, the residual's, swiglu's two gradients and w2's); outside the
 *     layers 2 D (the embedding output, the final norm's gathered output) plus
 *     2 V (the logits and their gradient, live together in the loss backward;
 *     split over tp under loss parallel; none without the head), and for a bf16
 *     run 4 V more (the loss's f32 copy of the logits and its f32 gradient, 8
 *     bytes per logit). A single-layer workload counts only its modules
 *     (dt_llama_config's no_*): attention 2 D + 5 D / tp, feed_forward 2 D +
 *     3 F / tp per token, and 6 D outside (its input or output, the probe R of
 *     its loss, their product and gradients) for the 2 D. Every term is the largest
 *     its values can take (KV heads counted as full heads, the residuals unsplit
 *     under sequence parallel): that is what makes it an upper bound. Context
 *     parallel with the allgather method adds one layer's K and V over the whole
 *     sequence.
 *
 * verify/badinput.sh checks measured peak <= estimate <= EST_FACTOR x
 * measured peak on small configs (debugmodel, every shipped plan, block and
 * model, f32 and f64).
 *
 * The invocation (what the machine must hold; all ranks of the threads backend
 * live in one process, and MPI ranks are assumed to share this machine): the
 * larger of the reference job (one rank, the whole model, no plan) and world
 * ranks of the sharded job, plus the verifier's f64 copies: the cached reference
 * snapshot (every step's gradients and the final weights: 8 bytes per parameter
 * per step, plus one) and, per sharded rank, the tensor it gathers to compare.
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "store.h"

/* The verifier's copies (bench/harness/verdict.c): f64 per element. The
 * reference snapshot keeps every parameter's gradient at every step plus the
 * final parameters; a sharded rank gathers one tensor at a time (bounded here
 * by the whole model, as the largest is not known without the plan's shapes). */
enum { CMP_BYTES = 8 };

/* Local elements of a [d0, d1] weight split over n ranks along one dim (the
 * larger piece of an uneven torch.chunk). */
static double split(double d0, double d1, int n) { return ceil(d0 / n) * d1; }

/* True when a [tp] Colwise/Rowwise entry of the plan matches fqn. */
static bool tp_sharded(const dt_plan *p, const char *fqn) {
  if (!p) return false;
  int tpi = dt_plan_dim(p, "tp");
  for (int i = 0; i < p->n_entries; i++) {
    const dt_plan_entry *e = &p->entries[i];
    if (e->dim != tpi) continue;
    if (e->style.kind != DT_STYLE_COLWISE && e->style.kind != DT_STYLE_ROWWISE) continue;
    if (dt_fqn_match(e->pattern, fqn)) return true;
  }
  return false;
}

/* Bytes one rank of a config holds at its peak (see the header). */
static double rank_bytes(const dt_llama_config *c, size_t elem, int tp, int dp, int cp, int batch,
                         int seq, const dt_plan *plan, bool one_step, double *nparams) {
  const double D = c->dim, V = c->vocab, H = c->n_heads, hd = (double)c->dim / c->n_heads;
  const double F = dt_llama_ffn_hidden(c);
  const double KVD = (c->n_kv_heads > 0 ? c->n_kv_heads : c->n_heads) * hd;
  double cap = plan && plan->bucket_cap_mb > 0 ? plan->bucket_cap_mb * 1048576.0
                                               : (double)DT_DDP_BUCKET_CAP_BYTES;
  if (cap < DT_DDP_FIRST_BUCKET_BYTES) cap = DT_DDP_FIRST_BUCKET_BYTES;
  const dt_plan *tp_plan = tp > 1 ? plan : NULL; /* TorchTitan applies TP only when tp > 1 */
  double local = 0, largest = 0, total = 0;
  double layer_local = 0; /* one layer's local weights: FSDP's layers.* unit */
  bool layer_tp = false;
  dt_llama_module md; /* the weights the workload has (lib/nn's tree, no_* left out) */
  for (int i = 0; dt_llama_module_at(c, i, &md); i++) {
    if (!md.wndim) continue;
    const double d0 = (double)md.wshape[0], d1 = md.wndim == 2 ? (double)md.wshape[1] : 1;
    const bool sharded = tp_sharded(tp_plan, md.fqn);
    const double w = sharded ? split(d0, d1, tp) : d0 * d1;
    local += w;
    total += d0 * d1;
    if (w > largest) largest = w;
    if (md.layer == 0) layer_local += w;
    if (md.layer >= 0 && md.kind == DT_MOD_LINEAR) layer_tp |= sharded;
  }
  const int tpa = layer_tp ? tp : 1, tpl = tp_plan && tp_plan->loss_parallel ? tp : 1;
  /* a layer's 8 D unsplit terms, half per sublayer; outside the layers a single-layer
   * workload holds 6 D: its input x (or output y), the probe R, y * R and their
   * gradients, where the model has the embedding output and the final norm's 4 D */
  const double attn_tok = c->no_attention ? 0 : 2 * D + (5 * D + 2 * H) / tpa;
  const double ffn_tok = c->no_feed_forward ? 0 : 2 * D + 3 * F / tpa;
  const double transients = 4 * D + (c->no_feed_forward ? 0 : 3 * F / tpa);
  const double outside = (c->no_embedding || c->no_head ? 6 * D : 2 * D) +
                         (c->no_head ? 0 : (elem < 4 ? 6 : 2) * V / tpl);
  const double per_token = c->n_layers * (attn_tok + ffn_tok) + transients + outside;
  const double tokens = ceil((double)batch / dp) * seq / cp;
  if (nparams) *nparams = total;
  bool fsdp = false; /* DDP's buckets: data parallel over dp_replicate x cp without FSDP */
  for (int i = 0; plan && i < plan->n_entries; i++)
    fsdp = fsdp || plan->entries[i].style.kind == DT_STYLE_FULLY_SHARD;
  const double bucket = (dp > 1 || cp > 1) && !fsdp
                            ? fmin(cap + (double)elem * largest, (double)elem * local)
                            : 0;
  /* context parallel, allgather: one layer's K and V over the whole sequence */
  const double kv_gathered =
      cp > 1 && plan && plan->cp_rotate == DT_CP_ALLGATHER ? 2 * KVD / tpa * tokens * cp : 0;
  /* FSDP: a unit's backward holds its all-gathered flat buffer and the parameters
   * copied out of it, its unsharded gradient and the reduce-scatter's flat input at
   * once: 3 copies of the largest unit (TorchTitan's: a layer, or the embedding or
   * the output alone), measured 2-2.2 on the single-layer workloads, where one unit
   * is most of the weights */
  const double fsdp_units = fsdp ? 3 * fmax(largest, layer_local) : 0;
  /* the forward and backward hold the weights, their gradients and AdamW's moments from
   * an earlier step (none in a run of one step: AdamW makes them in its first step)
   * beside the activations; the optimizer step holds the state and its transient */
  const double fb = (one_step ? 2 : 4) * local + fsdp_units + tokens * per_token + kv_gathered;
  const double opt = 4 * local + largest;
  return (double)elem * (fb > opt ? fb : opt) + bucket;
}

int sb_mem_estimate(const sb_opts *o, const dt_parallel_plan *rp, sb_mem_est *e) {
  const dt_plan *plan = rp ? &rp->plan : NULL; /* fitted to the mesh */
  memset(e, 0, sizeof *e);
  dt_llama_config c;
  dt_dtype dt;
  if (sb_workload_config(NULL, o->model, o->workload, &c) != DT_OK ||
      dt_dtype_parse(o->dtype, &dt) != DT_OK)
    return -1;
  const size_t elem = dt_dtype_size(dt);
  double P = 0;
  const bool one = o->warmup + o->steps <= 1;
  e->rank_bytes =
      rank_bytes(&c, elem, o->dims[4], o->dims[1], o->dims[3], o->batch, o->seq, plan, one, &P);
  const double snap = CMP_BYTES * P * (o->warmup + o->steps + 1);
  const double ref = rank_bytes(&c, elem, 1, 1, 1, o->batch, o->seq, NULL, one, NULL) + snap;
  const double sharded = o->world * (e->rank_bytes + CMP_BYTES * P) + snap;
  e->need_bytes = ref > sharded ? ref : sharded;
  return 0;
}

void sb_bytes_str(double bytes, char *buf, size_t n) {
  const double mib = 1024.0 * 1024.0, gib = 1024.0 * mib;
  if (bytes >= gib) snprintf(buf, n, "%.2f GiB", bytes / gib);
  else snprintf(buf, n, "%.2f MiB", bytes / mib);
}

double sb_mem_available(char *src, size_t n) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (f) {
    char line[256];
    unsigned long long kb = 0;
    bool found = false;
    while (!found && fgets(line, sizeof line, f))
      found = sscanf(line, "MemAvailable: %llu kB", &kb) == 1;
    fclose(f);
    if (found) {
      snprintf(src, n, "MemAvailable in /proc/meminfo");
      return (double)kb * 1024.0;
    }
  }
  long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
  if (pages > 0 && psz > 0) {
    snprintf(src, n, "sysconf(_SC_AVPHYS_PAGES)");
    return (double)pages * (double)psz;
  }
  snprintf(src, n, "unknown");
  return NAN;
}
