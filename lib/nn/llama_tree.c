/* lib/nn/llama_tree.c: the module tree of TorchTitan's Llama 3
 * (torchtitan/models/llama3/model/model.py at v0.2.0: Transformer,
 * TransformerBlock, Attention, FeedForward), described from a config alone:
 * each module's fqn, kind, weight shape and initialisation, in the order
 * dt_model_create adds them (a module's index is its RNG stream). One list that
 * the model, the plan checks (lib/parallel) and the harness's estimates share.
 *
 * Weights: tok_embeddings [vocab, dim], wq [n_heads hd, dim], wk and wv
 * [n_kv_heads hd, dim], wo [dim, n_heads hd], w1 and w3 [ffn_hidden, dim], w2
 * [dim, ffn_hidden], the norms [dim], output [vocab, dim] (nn.Linear's [out, in];
 * no biases). Initialisation (Transformer.init_weights and the modules'
 * init_weights): tok_embeddings N(0, 1); wq, wk, wv, w1 truncated N(0, 0.02);
 * wo, w2, w3 truncated N(0, 0.02 / sqrt(2 (layer + 1))) under depth_init, else
 * 0.02 / sqrt(2 n_layers); the truncated ones within PyTorch's trunc_normal_
 * default absolute bounds [-2, 2]; output truncated N(0, dim^-1/2) within
 * +-3 std; norms ones.
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "nn/nn.h"

/* Truncation bounds: output's +-3 std; the other truncated inits use PyTorch's
 * trunc_normal_ default absolute bounds [-2, 2]. */
static const double OUTPUT_TRUNC_STD = 3.0;
static const double TRUNC_ABS_BOUND = 2.0;
/* Init std of wq, wk, wv, w1 (and of wo, w2, w3 before depth scaling), as
 * Attention.init_weights and FeedForward.init_weights use it. */
static const double LINEAR_INIT_STD = 0.02;

/* The weight's dims in terms of the config. */
typedef enum dimsym { S_NONE = 0, S_DIM, S_VOCAB, S_QD, S_KVD, S_FFN } dimsym;

/* Per role: the name (in its block for the block's modules), kind and weight. */
static const struct {
  const char *name;
  dt_module_kind kind;
  dimsym d0, d1;
} k_roles[DT_LR_COUNT] = {
    [DT_LR_MODEL] = {"", DT_MOD_MODEL, S_NONE, S_NONE},
    [DT_LR_TOK_EMBEDDINGS] = {"tok_embeddings", DT_MOD_EMBEDDING, S_VOCAB, S_DIM},
    [DT_LR_BLOCK] = {"", DT_MOD_BLOCK, S_NONE, S_NONE},
    [DT_LR_ATTENTION_NORM] = {"attention_norm", DT_MOD_RMSNORM, S_DIM, S_NONE},
    [DT_LR_ATTENTION] = {"attention", DT_MOD_ATTENTION, S_NONE, S_NONE},
    [DT_LR_WQ] = {"attention.wq", DT_MOD_LINEAR, S_QD, S_DIM},
    [DT_LR_WK] = {"attention.wk", DT_MOD_LINEAR, S_KVD, S_DIM},
    [DT_LR_WV] = {"attention.wv", DT_MOD_LINEAR, S_KVD, S_DIM},
    [DT_LR_WO] = {"attention.wo", DT_MOD_LINEAR, S_DIM, S_QD},
    [DT_LR_FFN_NORM] = {"ffn_norm", DT_MOD_RMSNORM, S_DIM, S_NONE},
    [DT_LR_FEED_FORWARD] = {"feed_forward", DT_MOD_FEEDFORWARD, S_NONE, S_NONE},
    [DT_LR_W1] = {"feed_forward.w1", DT_MOD_LINEAR, S_FFN, S_DIM},
    [DT_LR_W2] = {"feed_forward.w2", DT_MOD_LINEAR, S_DIM, S_FFN},
    [DT_LR_W3] = {"feed_forward.w3", DT_MOD_LINEAR, S_FFN, S_DIM},
    [DT_LR_NORM] = {"norm", DT_MOD_RMSNORM, S_DIM, S_NONE},
    [DT_LR_OUTPUT] = {"output", DT_MOD_LINEAR, S_VOCAB, S_DIM},
};

/* A block's sublayers: attention_norm .. wo, and ffn_norm .. w3. */
enum {
  ATTN_MODS = DT_LR_WO - DT_LR_ATTENTION_NORM + 1,
  FFN_MODS = DT_LR_W3 - DT_LR_FFN_NORM + 1
};

dt_llama_layout dt_llama_layout_of(const dt_llama_config *c) {
  dt_llama_layout L;
  L.emb = c->no_embedding ? -1 : 1; /* after the root */
  L.block0 = c->no_embedding ? 1 : 2;
  L.attn = c->no_attention ? -1 : 1;
  L.ffn = c->no_feed_forward ? -1 : 1 + (c->no_attention ? 0 : ATTN_MODS);
  L.per_layer = 1 + (c->no_attention ? 0 : ATTN_MODS) + (c->no_feed_forward ? 0 : FFN_MODS);
  const int end = L.block0 + c->n_layers * L.per_layer;
  L.head = c->no_head ? -1 : end;
  L.n = end + (c->no_head ? 0 : 2);
  return L;
}

dt_llama_config dt_llama_config_whole(const dt_llama_config *c) {
  dt_llama_config w = *c;
  w.no_embedding = w.no_attention = w.no_feed_forward = w.no_head = false;
  return w;
}

static int64_t dim_of(const dt_llama_config *c, dimsym s) {
  const int64_t hd = c->n_heads > 0 ? c->dim / c->n_heads : 0; /* an unchecked config: no trap */
  switch (s) {
    case S_DIM: return c->dim;
    case S_VOCAB: return c->vocab;
    case S_QD: return c->n_heads * hd;
    case S_KVD: return c->n_kv_heads * hd;
    case S_FFN: return dt_llama_ffn_hidden(c);
    default: return 0;
  }
}

bool dt_llama_module_at(const dt_llama_config *c, int i, dt_llama_module *out) {
  memset(out, 0, sizeof *out);
  const dt_llama_layout L = dt_llama_layout_of(c);
  if (i < 0 || i >= L.n) return false;
  dt_llama_role role;
  int layer = -1;
  if (i == 0) role = DT_LR_MODEL;
  else if (i == L.emb) role = DT_LR_TOK_EMBEDDINGS;
  else if (L.head >= 0 && i >= L.head) role = i == L.head ? DT_LR_NORM : DT_LR_OUTPUT;
  else {
    const int j = i - L.block0, k = j % L.per_layer;
    layer = j / L.per_layer;
    if (k == 0) role = DT_LR_BLOCK;
    else if (L.attn >= 0 && k < L.attn + ATTN_MODS) role = (dt_llama_role)(DT_LR_ATTENTION_NORM + k - L.attn);
    else role = (dt_llama_role)(DT_LR_FFN_NORM + k - L.ffn);
  }
  const char *name = k_roles[role].name;
  if (layer < 0) snprintf(out->fqn, sizeof out->fqn, "%s", name);
  else snprintf(out->fqn, sizeof out->fqn, "layers.%d%s%s", layer, name[0] ? "." : "", name);
  out->kind = k_roles[role].kind;
  out->role = role;
  out->layer = layer;
  out->wshape[0] = dim_of(c, k_roles[role].d0);
  out->wshape[1] = dim_of(c, k_roles[role].d1);
  out->wndim = out->wshape[0] ? (out->wshape[1] ? 2 : 1) : 0;
  switch (role) {
    case DT_LR_TOK_EMBEDDINGS:
      out->init = DT_INIT_NORMAL;
      out->init_std = 1.0;
      break;
    case DT_LR_OUTPUT:
      out->init = DT_INIT_TRUNC_NORMAL;
      out->init_std = 1.0 / sqrt((double)c->dim);
      out->init_trunc = OUTPUT_TRUNC_STD;
      break;
    case DT_LR_ATTENTION_NORM:
    case DT_LR_FFN_NORM:
    case DT_LR_NORM: out->init = DT_INIT_ONES; break;
    case DT_LR_WQ:
    case DT_LR_WK:
    case DT_LR_WV:
    case DT_LR_W1:
    case DT_LR_WO:
    case DT_LR_W2:
    case DT_LR_W3: {
      const bool deep = role == DT_LR_WO || role == DT_LR_W2 || role == DT_LR_W3;
      const double std = !deep ? LINEAR_INIT_STD
                         : c->depth_init ? LINEAR_INIT_STD / sqrt(2.0 * (layer + 1))
                                         : LINEAR_INIT_STD / sqrt(2.0 * c->n_layers);
      out->init = DT_INIT_TRUNC_NORMAL;
      out->init_std = std;
      out->init_trunc = TRUNC_ABS_BOUND / std;
      break;
    }
    default: break; /* containers: no weight */
  }
  return true;
}
