/* lib/nn/nn.h: the Llama 3 model as TorchTitan defines it
 * (torchtitan/models/llama3/model/model.py and model/args.py at v0.2.0),
 * built from DTensor ops with autograd, plus AdamW.
 *
 * Modules carry TorchTitan's fully qualified names (tok_embeddings,
 * layers.N.attention_norm, layers.N.attention.{wq,wk,wv,wo}, layers.N.ffn_norm,
 * layers.N.feed_forward.{w1,w2,w3}, norm, output). Each module has an optional
 * pre- and post-hook on its activations and a placement for its weight; lib/parallel
 * installs styles through them (this layer knows nothing of styles). Weights are
 * generated from the sharding-invariant RNG (stream = the module's index), so every
 * layout, and the unsharded reference, starts from the same global weights.
 */
#ifndef DT_NN_H
#define DT_NN_H

#include "../autograd/autograd.h"
#include "safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_llama_config {
  char name[96];              /* the flavour, with its overrides as given */
  int dim, n_layers, n_heads, n_kv_heads, vocab, multiple_of;
  double ffn_dim_multiplier;  /* 0: none */
  double norm_eps;            /* 1e-5 */
  double rope_theta;          /* 500000 for every Llama 3 flavour */
  bool rope_scaling;          /* Llama 3.1 frequency scaling */
  bool depth_init;            /* wo/w2/w3 std 0.02/sqrt(2(layer+1)) */
  /* Modules left out, to run one layer type alone (all false: TorchTitan's whole
   * Transformer; dt_llama_config_get sets none). no_embedding: no tok_embeddings,
   * the input is an activation x [b, s, dim] (dt_model_forward_input); no_head: no
   * norm and output, the output is the last block's [b, s, dim]; no_attention /
   * no_feed_forward: every block is x + feed_forward(ffn_norm(x)) / x +
   * attention(attention_norm(x)), the other sublayer's modules absent. n_layers may
   * be 0 when the embedding or the head is kept. The parameter and FLOP counts
   * below count only the modules present. */
  bool no_embedding, no_attention, no_feed_forward, no_head;
} dt_llama_config;

/* "debugmodel", "8B", "70B", "405B", optionally followed by overrides
 * ":KEY=VALUE" (dim, n_layers, n_heads, n_kv_heads, vocab, multiple_of,
 * ffn_dim_multiplier, norm_eps, rope_theta, rope_scaling 0|1, depth_init 0|1),
 * e.g. "debugmodel:n_layers=2:n_kv_heads=4" (TorchTitan's TransformerModelArgs
 * fields); the result is checked (dt_llama_config_check). DT_ERR_INVALID naming
 * the flavour, key or value otherwise. */
dt_status dt_llama_config_get(dt_ctx *ctx, const char *name, dt_llama_config *out);
/* TorchTitan's FeedForward hidden size (multiple_of, ffn_dim_multiplier). */
int dt_llama_ffn_hidden(const dt_llama_config *c);
/* The parameters of the modules present (all: TorchTitan's count). */
int64_t dt_llama_nparams(const dt_llama_config *c);
/* Training FLOPs per token at sequence length seq, TorchTitan's count
 * (torchtitan/models/utils.py get_dense_model_nparams_and_flops):
 * 6 (N - N_embedding) + 12 L H hd seq, attention counted full (no causal discount);
 * over the modules present (the 12 L H hd seq term for the layers with attention;
 * the embedding alone: 0, a lookup has no matmul). */
double dt_llama_flops_per_token(const dt_llama_config *c, int64_t seq);
/* Checks a config (dims divide into heads, kv heads divide heads, ...). */
dt_status dt_llama_config_check(dt_ctx *ctx, const dt_llama_config *c);

typedef enum dt_module_kind {
  DT_MOD_EMBEDDING = 0, DT_MOD_LINEAR, DT_MOD_RMSNORM, DT_MOD_ATTENTION, DT_MOD_FEEDFORWARD,
  DT_MOD_BLOCK, DT_MOD_MODEL
} dt_module_kind;

typedef enum dt_init_kind { DT_INIT_NONE = 0, DT_INIT_NORMAL, DT_INIT_TRUNC_NORMAL, DT_INIT_ONES } dt_init_kind;

/* ---- the module tree, described (lib/nn/llama_tree.c) ---- */

/* Each module's place in a block or the model (TorchTitan's Transformer,
 * TransformerBlock, Attention and FeedForward attributes), in the model's order. */
typedef enum dt_llama_role {
  DT_LR_MODEL = 0, DT_LR_TOK_EMBEDDINGS,
  DT_LR_BLOCK,                                     /* layers.N */
  DT_LR_ATTENTION_NORM, DT_LR_ATTENTION, DT_LR_WQ, DT_LR_WK, DT_LR_WV, DT_LR_WO,
  DT_LR_FFN_NORM, DT_LR_FEED_FORWARD, DT_LR_W1, DT_LR_W2, DT_LR_W3,
  DT_LR_NORM, DT_LR_OUTPUT,
  DT_LR_COUNT
} dt_llama_role;

/* One module of a config's model as dt_model_create lists it, with no model
 * made: its fqn, kind, weight and initialisation (Transformer.init_weights). */
typedef struct dt_llama_module {
  char fqn[64];
  dt_module_kind kind;
  dt_llama_role role;
  int layer;          /* the block (layers.N) it is in, the block itself included;
                       * -1: the root, tok_embeddings, norm, output */
  int wndim;          /* 0: no weight (a container); 1: norm [dim]; 2: linear [out, in],
                       * embedding [vocab, dim] */
  int64_t wshape[2];
  dt_init_kind init;
  double init_std, init_trunc; /* as dt_module's */
} dt_llama_module;

/* Where a config's modules are in its list: tok_embeddings at emb (after the root
 * ""), block l's modules from block0 + l * per_layer (the block first; its
 * attention_norm at offset attn, ffn_norm at ffn), norm at head and output after
 * it; -1 for the parts the config's no_* fields leave out. n: modules in all. */
typedef struct dt_llama_layout {
  int emb, block0, per_layer, attn, ffn, head, n;
} dt_llama_layout;
dt_llama_layout dt_llama_layout_of(const dt_llama_config *c);
/* Module i (0 <= i < dt_llama_layout_of(c).n) of c's model, parents before
 * children: "" (the model), tok_embeddings, per layer N: layers.N,
 * layers.N.attention_norm, layers.N.attention, layers.N.attention.{wq,wk,wv,wo},
 * layers.N.ffn_norm, layers.N.feed_forward, layers.N.feed_forward.{w1,w2,w3};
 * then norm, output; without the modules c's no_* fields leave out. c must pass
 * dt_llama_config_check. false (out zeroed) when i is out of range. */
bool dt_llama_module_at(const dt_llama_config *c, int i, dt_llama_module *out);
/* c with every module present (the no_* fields false), n_layers as c's: the
 * model a part of it is cut from. */
dt_llama_config dt_llama_config_whole(const dt_llama_config *c);

typedef struct dt_module dt_module;
struct dt_tape;

/* A hook sees the module's activations (inputs before it runs, outputs after)
 * and may replace them (io[i] = a new var made on the tape). */
typedef dt_status (*dt_module_hook)(dt_ctx *ctx, dt_module *m, struct dt_tape *tape, dt_var **io,
                                    int n, void *state);

struct dt_module {
  char fqn[64];
  dt_module_kind kind;
  int index;                       /* position in the model's module list (RNG stream) */
  /* the weight (linear [out, in], embedding [vocab, dim], norm [dim]); none for containers */
  int wndim;
  int64_t wshape[2];
  dt_init_kind init;
  double init_std;                 /* normal / truncated normal */
  double init_trunc;               /* truncated normal: bounds at +-init_trunc * init_std
                                    * (output: 3; the others: TorchTitan's default absolute
                                    * [-2, 2], i.e. 2 / init_std) */
  dt_placement wpl[DT_MAX_MESH_DIMS]; /* the weight's placements (R unless a style says) */
  bool has_opl;                    /* AdamW's state placed by opl instead of wpl (ZeRO-1): */
  dt_placement opl[DT_MAX_MESH_DIMS]; /* wpl with Shard(0) on mesh dims where wpl is
                                    * Replicate; AdamW then updates only the rows of the
                                    * weight its state's shard covers, in place */
  dt_var *weight;                  /* on the model's tape; NULL before materialize */
  dt_var *compute;                 /* what this step's forward computes with instead of
                                    * weight (FSDP's unsharded copy, on the step tape);
                                    * NULL: weight. end_step resets it. */
  dt_module_hook pre, post;        /* installed by lib/parallel; NULL: none */
  void *hook_state;                /* owned by whoever installed the hooks */
  void (*hook_free)(dt_ctx *ctx, void *hook_state); /* dt_model_free calls it; NULL: none */
};

/* Activation checkpointing of the transformer blocks (TorchTitan's
 * [activation_checkpoint] mode and selective_ac_option,
 * torchtitan/distributed/activation_checkpoint.py _apply_ac_to_transformer_block):
 *   DT_AC_NONE       nothing checkpointed (the default here; bitwise the old step);
 *   DT_AC_FULL       every block keeps only its input and recomputes its forward;
 *   DT_AC_SELECTIVE  every > 0: every N-th block fully, counted from 1 as the
 *                    wrapper's _count does (blocks l with (l + 1) % N == 0, l the
 *                    global layer index: TorchTitan counts the blocks one process
 *                    wraps, the same unless a pipeline rank's first layer is not a
 *                    multiple of N); every 0 ("op"): each block with the op-level
 *                    policy of _save_list: the outputs of mm (the linears), SDPA
 *                    (sdpa, sdpa_cp as one op) and reduce_scatter are saved, except
 *                    every second mm, the rest recomputed.
 * fault_zero_call: dt_checkpoint_opts's planted bug, for tests (0: off). */
typedef enum dt_ac_mode { DT_AC_NONE = 0, DT_AC_SELECTIVE, DT_AC_FULL } dt_ac_mode;
typedef struct dt_ac_config {
  dt_ac_mode mode;
  int every;
  int fault_zero_call;
} dt_ac_config;
/* Parses TorchTitan's names: mode "none" | "selective" | "full", option "op" or a
 * positive integer (NULL: TorchTitan's default "2"; ignored unless selective).
 * DT_ERR_INVALID naming the bad value. */
dt_status dt_ac_parse(dt_ctx *ctx, const char *mode, const char *option, dt_ac_config *out);
/* "none", "full", "selective:op", "selective:N" into buf (for config keys). */
const char *dt_ac_str(const dt_ac_config *ac, char *buf, size_t n);
/* Whether block l is checkpointed under ac. */
bool dt_ac_block(const dt_ac_config *ac, int l);

typedef struct dt_model {
  dt_llama_config cfg;
  dt_mesh *mesh;
  dt_dtype dtype;
  uint64_t seed;
  int n_mods;
  dt_module *mods;                 /* every module, parents before children */
  struct dt_tape *tape;            /* long-lived: holds only the weights (leaves) and
                                    * their gradients */
  struct dt_tape *step_tape;       /* one step's graph (activations), recorded on a tape
                                    * of its own whose ops read the weight vars of `tape`;
                                    * made by the first forward, freed by end_step. Hooks
                                    * receive this tape. */
  /* Parameter hooks (FSDP, lib/parallel/fsdp.c): at every module boundary, before
   * the module's own pre hook and after its post hook; for the model root
   * (mods[0]) at the start (io: the tokens) and end (io: the logits) of forward. */
  dt_module_hook param_pre, param_post;
  void *param_state;
  void (*param_free)(dt_ctx *ctx, void *param_state); /* dt_model_free calls it */
  /* Context parallel (set by lib/parallel's dt_context_parallel): the sequence dim
   * of the tokens and activations is sharded over mesh dim cp_dim and stored in
   * cp_chunks head-tail order (dt_seq_position; 0: natural); attention runs sdpa_cp
   * with rotate method cp_rotate. cp_dim -1: none. */
  int cp_dim, cp_chunks;
  dt_cp_rotate cp_rotate;
  /* AdamW state per module weight (same placements as the weight) */
  dt_tensor *adam_m, *adam_v;
  /* bf16 weights only: the f32 master weights AdamW steps (placed as adam_m),
   * made from the weights at the first step; the bf16 weight is rounded from
   * the master after each step (TorchTitan's FSDP2 MixedPrecisionPolicy
   * (param_dtype=bf16, reduce_dtype=f32): the optimizer owns f32 parameters) */
  dt_tensor *adam_master;
  int adam_step;
  dt_ac_config ac;                 /* activation checkpointing (zero: none) */
  /* The placements of the activation between blocks (a pipeline stage boundary),
   * set by lib/parallel (dt_parallelize_llama): what a stage receives where it
   * cannot ask its sender (the fake comm of shape-only runs). false: unknown. */
  bool has_act_pl;
  dt_placement act_pl[DT_MAX_MESH_DIMS];
} dt_model;

/* Builds the module tree (no weights yet). mesh may be NULL for a model that is
 * only described (names, shapes: dt_model_weights_check), never materialized. */
/* dtype: f32, f64, or bf16 (parameters and activations in bf16; the ops
 * decide where bf16 runs: the device kernels, not the host loops). */
dt_status dt_model_create(dt_ctx *ctx, dt_mesh *mesh, const dt_llama_config *cfg, dt_dtype dtype,
                          uint64_t seed, dt_model **out);
void dt_model_free(dt_ctx *ctx, dt_model *m);
/* The module with this fqn, or NULL. */
dt_module *dt_model_find(dt_model *m, const char *fqn);
/* Generates every weight with its module's wpl from the RNG (no comm). Call after
 * the placements are set (lib/parallel) and before the first forward. The values
 * are made on the host (the counter RNG: the same for every layout and device)
 * and, when the rank's device (ctx->device) is not the CPU, uploaded to it once. */
dt_status dt_model_materialize(dt_ctx *ctx, dt_model *m);
/* One forward on the model's tape: tokens i64 [b, s] (a DTensor on the model's
 * mesh) -> logits var [b, s, vocab]. Hooks run at every module boundary. A model
 * without the embedding or the head: dt_model_forward_input. */
dt_status dt_model_forward(dt_ctx *ctx, dt_model *m, const dt_tensor *tokens, dt_var **logits);
/* dt_model_forward for any model (with or without the embedding and the head,
 * dt_llama_config's no_* fields): in is the tokens (i64 [b, s]) when the model has
 * tok_embeddings, else the activation x [b, s, dim] in the model's dtype, copied
 * into a leaf without a gradient; both on the model's mesh. *out is the logits, or
 * [b, s, dim] for a model without the head. The root's parameter hooks run (io:
 * the input's leaf, then *out), as in dt_model_forward. */
dt_status dt_model_forward_input(dt_ctx *ctx, dt_model *m, const dt_tensor *in, dt_var **out);
/* A contiguous part of the model, a pipeline stage's (TorchTitan's
 * pipeline_module_split keeps these modules of the model): tok_embeddings when
 * first, transformer layers [layer0, layer1), norm and output when last. first
 * needs a model with the embedding, last one with the head. */
typedef struct dt_model_part {
  bool first;
  int layer0, layer1;
  bool last;
} dt_model_part;
/* The part's forward on m->step_tape (made when NULL; a pipeline runs each
 * microbatch on a tape of its own by setting m->step_tape around the call):
 * the first part from tokens (x NULL), a later one from x (the previous part's
 * output [b, s, dim], e.g. a received activation made a leaf that requires a
 * gradient); *out is [b, s, dim], or the logits when last. Module hooks run as in
 * dt_model_forward; the model root's parameter hooks do not. */
dt_status dt_model_forward_part(dt_ctx *ctx, dt_model *m, const dt_model_part *part,
                                const dt_tensor *tokens, dt_var *x, dt_var **out);
/* Mean cross-entropy of logits against targets (i64 [b, s]) -> 0-d loss var; bf16
 * logits are cast to f32 first (TorchTitan's loss), so the loss is then f32. */
dt_status dt_model_loss(dt_ctx *ctx, dt_model *m, dt_var *logits, const dt_tensor *targets,
                        dt_var **loss);
/* Backward from the loss; afterwards every weight var has its gradient. */
dt_status dt_model_backward(dt_ctx *ctx, dt_model *m, dt_var *loss);
/* Drops the step's graph (activations, non-leaf vars), keeping weights and grads. */
dt_status dt_model_end_step(dt_ctx *ctx, dt_model *m);

/* ---- weights in safetensors files (lib/nn/safetensors.h) ---- */

/* How a file names the weights: TorchTitan's fqns ("layers.0.attention.wq.weight",
 * the model's state_dict) or Hugging Face Llama's ("model.layers.0.self_attn.q_proj.weight",
 * wq and wk rows permuted for HF's rotate-half rope), as TorchTitan's
 * Llama3StateDictAdapter maps them (torchtitan/models/llama3/model/state_dict_adapter.py). */
typedef enum dt_weight_names { DT_NAMES_TORCHTITAN = 0, DT_NAMES_HF = 1 } dt_weight_names;

/* The file name of module md's weight under names; buf of n bytes. */
void dt_weight_name(const dt_module *md, dt_weight_names names, char *buf, size_t n);
/* Checks f against m (no data read): the naming (TorchTitan's or HF's, told by
 * the embedding's name) into *names, every weight present once with its shape
 * and a float dtype (F64, F32, BF16, F16), no other tensor. DT_ERR_INVALID
 * naming the file and the tensor otherwise. */
dt_status dt_model_weights_check(dt_ctx *ctx, const dt_model *m, const dt_st_file *f,
                                 dt_weight_names *names);
/* Replaces every weight's values by path's (checked first, as above; converted
 * to the model's dtype): each rank reads only the rows of its own shard. Call
 * after dt_model_materialize, before the first step; resets AdamW's state. On
 * an I/O error after the check the weights are partly replaced: free the model. */
dt_status dt_model_load_weights(dt_ctx *ctx, dt_model *m, const char *path);
/* Writes the global weights (gathered one at a time: collective on the mesh) to
 * path as dtype (F32, F64 or BF16) under names, with the metadata pairs (n_meta,
 * keys, vals; may be 0). The rank at mesh coordinates 0 writes (PATH.tmp, then
 * renamed); the others return DT_OK once they took part in the gathers. */
dt_status dt_model_save_weights(dt_ctx *ctx, dt_model *m, const char *path, dt_dtype dtype,
                                dt_weight_names names, int n_meta, const char *const *keys,
                                const char *const *vals);

/* This rank's bytes of the model's state: every weight's local array held (a
 * released one, dt_pipeline_release_foreign, counts none), every
 * weight's gradient held now (none before backward or after the optimizer), and
 * AdamW's two states (none before the first step). */
typedef struct dt_model_mem {
  int64_t params, grads, optimizer;
} dt_model_mem;
void dt_model_state_bytes(const dt_model *m, dt_model_mem *out);

typedef struct dt_adamw {
  double lr, beta1, beta2, eps, weight_decay;
} dt_adamw;
#define DT_ADAMW_DEFAULT {8e-4, 0.9, 0.95, 1e-8, 0.1}
/* One AdamW step on every weight from its gradient (reduced to the weight's
 * placements first), decoupled weight decay, bias correction; clears grads.
 * Host weights: a loop here; device weights: the device's optim.adamw kernel
 * (lib/device/kernels.h), state on the same device, bf16 weights through f32
 * master weights and moments (adam_master). A
 * module with has_opl keeps its state in opl's shard and updates only those rows
 * of its (replicated) weight: whoever set opl brings the other rows up to date. */
dt_status dt_model_adamw_step(dt_ctx *ctx, dt_model *m, const dt_adamw *opt);

#ifdef __cplusplus
}
#endif
#endif
