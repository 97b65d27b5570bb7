/* llmpress's CPU kernels: the one statement of their interface.
 *
 * compress/kernels/c_api.py reads this file to declare every function and struct to
 * ctypes, so Python cannot restate a signature differently; every .c file includes it,
 * so the compiler checks each definition against it. Keep declarations to the forms
 * c_api.py reads: one declaration per statement, types from its table, no macros.
 *
 * Why C: torch's packed CPU kernels reach 2-6 GB/s on AVX2 machines, far below memory
 * bandwidth, and its per-op overhead dominates a small model's decode step. Activations
 * are quantized per block of 32 to int8 (one scale each) and multiplied with the packed
 * weights in integer SIMD (u8 x s8 -> s32), then scaled in float.
 *
 * Layouts (K is padded to a multiple of 32 by the caller, padding holds zero activations):
 *   weights      panels of 8 output columns; w = code * scale - zs, zs = (zero point +
 *                offset) * scale; int4 codes unsigned 0..15, int8 codes signed. Within a
 *                tile each block of 32 inputs is stored as quads (4 consecutive inputs) of
 *                all 8 columns: 32 bytes [col 0: k0..k3 | col 1: k0..k3 | ... | col 7:
 *                k0..k3], the operand layout of a u8 x s8 dot product that sums 4 products
 *                into one 32-bit lane per column. A quad of one row's activations is then
 *                a single 32-bit broadcast: each weight vector, unpacked once, serves every
 *                activation row of the tile with no shuffles, and each output column stays
 *                in its own lane (no horizontal sums).
 *                  int4: 128 bytes per (tile, block): vector j (0..3) holds quad j in its
 *                        low nibbles and quad j+4 in its high nibbles.
 *                  int8: 256 bytes per (tile, block): vector q holds quad q.
 *                  scale, zs: float [tiles, K/G, 8]; columns past N are zero. zs may be
 *                        NULL: symmetric codes, zs = offset * scale (8 for int4, 0 for
 *                        int8).
 *   activations  x8 int8 [M, K], dx float [M, K/32], bsum float [M, K/32] (each block's sum
 *                of its quantized values, for the zero-point term: the product is then
 *                exactly sum(w * x_quantized), so the offset in code * scale adds no error).
 * G is a multiple of 32. Instruction paths: AVX-VNNI or AVX512-VNNI (dpbusd), AVX2
 * (maddubs + madd), and portable C; the build picks by -march=native and tests build all.
 *
 * Functions returning int return 0, or -1 where they could not allocate their scratch.
 */
#ifndef LLMPRESS_H
#define LLMPRESS_H

#include <stdint.h>

/* Activations of the MLP's gate (llmp_act_mul_quant), or of its up projection where it
 * has no gate (llmp_act_quant): the layers' `act`. ACT_RELU2: relu(x)^2. ACT_XIELU (an
 * MLP without a gate, apertus): with the layer's p = {alpha_p, alpha_n, beta, eps} (their
 * effective values), x > 0: alpha_p x^2 + beta x; else (expm1(min(x, eps)) - x) alpha_n
 * + beta x. ACT_GELU: the exact gelu, 0.5 x (1 + erf(x / sqrt 2)) (gpt_neox's). */
enum { ACT_SILU = 0, ACT_GELU_TANH = 1, ACT_RELU2 = 2, ACT_XIELU = 3, ACT_GELU = 4 };

/* The KV cache as compress/runtime/kv_cache.py allocates it: a pool of blocks of `block`
 * tokens, every pooled array [layers, kv_heads, n_blocks, ...], contiguous; position p of a
 * slot lives in pool block table[slot * max_blocks + p / block], at row p % block:
 *   fp32 (bits 0): k, v [.., block, d].
 *   KIVI (bits 8 or 4): codes kq, vq [.., block, d*bits/8] (int4: channel 2j in byte j's
 *   low nibble, 2j+1 in its high one); keys per channel over groups of `group` tokens:
 *   ks, km [.., block/group, d]; values per token: vs, vm [.., block]; the newest tokens of
 *   an unfinished group in fp32, per slot (not pooled): kr, vr [layers, slots, kv_heads,
 *   group, d]. value = code * scale + min. */
typedef struct {
    int bits, block, group, slots, kv_heads, d, max_blocks, n_blocks;
    const int32_t *table;
    float *k, *v;
    uint8_t *kq, *vq;
    float *ks, *km, *vs, *vm, *kr, *vr;
} KVC;

/* One chunk of a prefill step's attention: q rows (stride qs), its keys/values (element
 * (g, j, d) at g * kg + j * kj + d, positions 0..start + T - 1), out rows (stride os). */
typedef struct {
    const float *q, *k, *v;
    float *out;
    int64_t qs, os, kg, kj, vg, vj;
    int T, start;
} PChunk;

/* A packed linear as the one-call layers take it. */
typedef struct {
    const uint8_t *w;
    const float *scale, *zs;
    int n, k, g, bits;   /* k: padded input width the codes were packed for */
    const int32_t *oidx; /* LLM.int8()-style outlier input columns (their codes are zero) */
    const float *ow;     /* and their weights [n, n_out], kept in full precision */
    int n_out;
    const float *bias;   /* [n] or NULL */
    int split;           /* 8-bit: two-term activations (llmp_gemm_q8_split) */
} QLin;

/* A Mixture-of-Experts MLP: an fp32 router [E, hidden], softmax over its logits (or each
 * one's sigmoid, or PhiMoE's sparsemixer), top_k (chosen by score plus an optional per-expert bias, within the
 * best expert groups where there are groups), optional
 * renormalization of the chosen weights, times `scale` (llmp_route); then the rows routed
 * to each chosen expert gathered and run through its gate_up and down, so an expert's
 * weights are read once per step and an unchosen one not at all. */
typedef struct {
    const float *router;
    const float *router_bias; /* [E] added to the logits (a LayerNorm's bias folded in); or NULL */
    const QLin *experts; /* [2E]: gate_up of expert e at 2e, its down at 2e + 1 */
    int n_experts, top_k, renorm, inter;
    int64_t *reads;      /* [E]: steps that read each expert (the runtime's MBU) */
    const QLin *shared;  /* [2]: a shared expert's gate_up and down (qwen2_moe); or NULL */
    const float *shared_gate; /* [hidden]: its output is times sigmoid(shared_gate . x);
                               * NULL: added as it is (glm4_moe's shared experts) */
    int shared_inter;
    int scoring;              /* scores: 0 the softmax, 1 each logit's sigmoid, 2 sparsemixer,
                               * 3 sigmoids chosen by logit plus choice_bias (Kolibri's) */
    float jitter;             /* sparsemixer's threshold (router_jitter_noise) */
    const float *choice_bias; /* [E] added to the scores to choose (NULL: none) */
    float scale;              /* the weights times this (routed_scaling_factor) */
    int n_group, topk_group;  /* chosen within topk_group of n_group expert groups (1, 1:
                               * none), each scored by its best two, or its best (group_max) */
    int group_max;
    float shared_scale;       /* the shared expert's output times this (cohere2_moe's 0.5) */
} QMoe;

/* Multi-head latent attention (DeepSeek's MLA) in the absorbed form (runtime/weights.py's
 * Latent): the layer's qkv linear gives [q (q_width), latent (kv_rank), one rotated key
 * part (rope)] a row; q through q_norm and q_b where q_norm is set (else qkv's q part is
 * every head's q, [rotated, unrotated] as ordered at load). The cache holds one head a
 * token, [rotated key part, latent through kv_norm], the key and the value alike; a
 * head's query is its rotated part beside its unrotated part through uk[h], and its
 * attention output's latent goes to o through uv[h]. */
typedef struct {
    int q_width, kv_rank, nope, rope, v;
    const float *q_norm;  /* [q_width]; or NULL */
    QLin q_b;             /* [heads * (rope + nope), q_width] where q_norm is set */
    const float *kv_norm; /* [kv_rank] */
    const QLin *uk;       /* [heads]: each [kv_rank, nope], kv_b's key rows transposed */
    const QLin *uv;       /* [heads]: each [v, kv_rank], kv_b's value rows */
    float eps;            /* both norms' */
} QMla;

/* Gated DeltaNet linear attention in place of attention (runtime/deltanet.py): the layer's
 * qkv linear gives [in_proj_qkv's 2 * k_heads * k_dim + v_heads * v_dim channels,
 * in_proj_z's v_heads * v_dim] a row, o reads the mixing's v_heads * v_dim (llmp_deltanet);
 * the sequence in slot s keeps its convolution tail at tail + s * tail_stride and its state
 * at state + s * state_stride, bound to the cache before each step. */
typedef struct {
    int k_heads, v_heads, k_dim, v_dim, kernel;
    const float *ba, *conv, *decay, *dt_bias, *norm;
    float eps;
    float *tail, *state;
    int64_t tail_stride, state_stride;
} QDelta;

/* A Mamba-2 mixer in place of attention (runtime/mamba.py): the layer's qkv is its in_proj
 * [heads * head_dim + channels + heads] a row, o reads the mixing's heads * head_dim
 * (llmp_mamba2); tail and state point at the cache's states, a slot's at slot * stride. */
typedef struct {
    int heads, head_dim, state_size, groups, kernel;
    const float *conv, *conv_bias, *decay, *dt_bias, *d, *norm;
    float eps;
    float *tail, *state;
    int64_t tail_stride, state_stride;
} QMamba;

/* A Mamba (selective scan) mixer in place of attention, Jamba's (runtime/mamba.py's Mamba1):
 * the layer's qkv is its in_proj [2 * width] a row, o reads width (llmp_mamba1); tail and
 * state point at the cache's states, a slot's at slot * stride. */
typedef struct {
    int width, state_size, rank, kernel;
    const float *conv, *conv_bias, *x_proj, *dt_proj, *dt_bias, *decay, *d, *dt_norm, *b_norm, *c_norm;
    float eps;
    float *tail, *state;
    int64_t tail_stride, state_stride;
} QMamba1;

/* LFM2's gated short convolution in place of attention (runtime/short_conv.py): the
 * layer's qkv is its in_proj [3 * width] a row, o reads width (llmp_short_conv); tail
 * points at the cache's states, a slot's at slot * tail_stride. */
typedef struct {
    int width, kernel;
    const float *conv;
    float *tail;
    int64_t tail_stride;
} QConv;

/* One block. What differs between families arrives as data (compress/model/spec.py's
 * BlockSpec, read by compress/runtime/backends.py): norm weights already in their
 * effective form (gemma's 1 + w), optional q/k and sandwich norms (NULL when absent),
 * biases, each layer's rope tables, sliding window, attention softcap and residual
 * multiplier. */
typedef struct {
    const float *attn_norm, *mlp_norm;          /* [hidden]; or NULL: the branch reads h (olmo2) */
    QLin qkv, o, gate_up, down; /* gate_up and down unused where moe is set */
    const float *q_norm, *k_norm;               /* [D] per head, or (qk_full) over all heads
                                                 * [heads * D], before rope; or NULL */
    const float *post_attn_norm, *post_mlp_norm; /* [hidden], on branch outputs; or NULL */
    const float *cos, *sin;                     /* this layer's rope tables [max_len, R/2] */
    const float *q_scale;                       /* [max_len]: each query times this after rope
                                                 * (Llama 4's temperature); or NULL */
    int qk_after_rope;                          /* q_norm/k_norm (per head) follow rope (hunyuan) */
    int window;                                 /* sliding window; 0: every key */
    float softcap;                              /* scores cap*tanh(s/cap) (gemma2); 0: none */
    float residual;                             /* branch outputs' multiplier (granite); else 1 */
    int qk_full;                                /* q_norm/k_norm span all heads (olmo2) */
    const QMoe *moe;                            /* experts in place of the dense MLP; or NULL */
    int center;                                 /* every norm of the layer (and the final
                                                 * norm, the last layer's) subtracts the mean
                                                 * first: LayerNorm without a bias (cohere) */
    int qk_each;                                /* q_norm/k_norm hold a weight row per head
                                                 * ([heads * D], each head its own: cohere) */
    int parallel;                               /* the MLP reads the block's input, as
                                                 * attention does (cohere) */
    int ungated;                                /* the MLP is down(act(up(x))): gate_up holds
                                                 * up alone (arcee) */
    const float *act_params;                    /* [4]: ACT_XIELU's p; or NULL */
    const QMla *mla;                            /* latent attention in place of q/k/v
                                                 * (qkv holds what reads the norm); or NULL */
    int gated;                                  /* qkv's rows end with heads * D gate
                                                 * values: attention's output times their
                                                 * sigmoid before o (afmoe) */
    const float *sinks;                         /* [heads]: each head's softmax denominator
                                                 * plus exp(sink) (gpt-oss, granite_swa);
                                                 * or NULL */
    const QDelta *delta;                        /* a Gated DeltaNet in place of attention
                                                 * (qkv its in_proj_qkv and in_proj_z, o its
                                                 * out_proj); or NULL */
    int kv_layer;                               /* its layer of the KV cache, which holds
                                                 * the attention layers alone */
    const QMamba *mamba;                        /* a Mamba-2 mixer in place of attention
                                                 * (qkv its in_proj, o its out_proj); or NULL */
    const QConv *conv;                          /* a short convolution in place of attention
                                                 * (qkv its in_proj, o its out_proj); or NULL */
    const QMamba1 *mamba1;                      /* Jamba's Mamba in place of attention (qkv
                                                 * its in_proj, o its out_proj); or NULL */
} QLayer;

/* A decode step from token ids: what the one-call decoder needs besides the tokens, fixed
 * at load. The embedding is fp32 (kind 0), bf16 (1) or fp16 (2), rows times embed_scale. */
typedef struct {
    const QLayer *layers;
    int n_layers, hidden, heads, kv_heads, D, inter;
    float eps;
    int R;
    float scale;
    int act;
    const float *final_norm;
    const QLin *head;
    const void *embed;
    int embed_kind;
    float embed_scale;
} DecodeCtx;

/* ---- threads.c */
int llmp_has_avx2(void);
void llmp_set_threads(int n);
int llmp_get_threads(void);
void llmp_release_threads(void);

/* ---- panels.c: row-major codes into the panel layout, and panels back to fp32 */
void llmp_to_panels(const int8_t *q, int64_t n, int k, int kp, int bits, int offset, void *out);
void llmp_dequant_q4(const uint8_t *w, const float *scale, const float *zs, int N, int K, int G, float *out);
void llmp_dequant_q8(const int8_t *w, const float *scale, const float *zs, int N, int K, int G, float *out);

/* ---- quantize.c: fp32 rows [M, K] into the activation layout */
void llmp_quantize_rows(const float *x, int M, int K, int8_t *x8, float *dx, float *bsum);

/* ---- gemm.c: y [M, N] = x @ W.T over packed weights */
void llmp_gemm_q4(const int8_t *x8, const float *dx, const float *bsum, int M, int K, int G, const uint8_t *w, const float *scale, const float *zs, int N, float *y);
void llmp_gemm_q8(const int8_t *x8, const float *dx, const float *bsum, int M, int K, int G, const uint8_t *w, const float *scale, const float *zs, int N, float *y);
int llmp_gemm_q8_split(const int8_t *x8, const float *dx, const float *bs, const float *xf, int ld, int kx, int M, int K, int G, const uint8_t *w, const float *scale, const float *zs, int N, float *y);
int llmp_gemm_dynamic_rows(int rows);
int llmp_amx_enable(int on);
int llmp_amx_state(void);
/* peak.c: every thread's `reps` rounds of register-held integer dot products, as the
 * GEMM runs them; returns the multiply-adds done (time it for the ceiling MFU uses) */
int64_t llmp_dot_peak(int64_t reps);

/* ---- dense.c: dense fp32 (kind 0), bf16 (1) or fp16 (2) weights at decode batches */
/* The instruction set the dense tiles were built for: 2 AVX-512, 1 AVX2, 0 plain C. */
int llmp_dense_isa(void);
void llmp_gemv_f32(const float *x, int M, int K, const float *w, int N, float *y);
void llmp_gemv_16(const float *x, int M, int K, const uint16_t *w, int kind, int N, float *y);

/* ---- elementwise.c */
void llmp_rmsnorm_quant(const float *x, const float *w, float eps, int center, int M, int K, int Kp, float *out, int8_t *x8, float *dx, float *bsum);
void llmp_act_mul_quant(const float *gu, int M, int I, int Ip, int act, float *out, int8_t *x8, float *dx, float *bsum);
void llmp_act_quant(const float *u, int M, int I, int Ip, int act, const float *p, float *out, int8_t *x8, float *dx, float *bsum);
void llmp_rope(float *x, const int64_t *positions, const float *cos_t, const float *sin_t, int T, int heads, int D, int R);
void llmp_rms_rows(float *x, int64_t rows, int D, const float *w, int wrows, float eps, int center);
void llmp_gate_rows(float *att, int64_t rows, int width, const float *gate, int64_t ld);

/* ---- decode_attention.c and prefill_attention.c */
int llmp_decode_attention(const KVC *c, int layer, const float *q, const float *knew, const float *vnew, const int64_t *slots, const int64_t *positions, int B, int H, float scale, int window, float softcap, float *out, const float *sinks);
int llmp_prefill_attention(const PChunk *c, int nc, int heads, int kv_heads, int D, float scale, int window, float softcap, const float *sinks);

/* ---- moe.c */
void llmp_sigmoid_gate(const float *xf, int B, int ld, const float *w, int hidden, float *gate);
void llmp_route(const float *xf, int B, int ld, const float *router, const float *router_bias, int E, int hidden, int K, int renorm, int scoring, float jitter, const float *bias, float scale, int n_group, int topk_group, int group_max, float *logits, int32_t *choice, float *weight);

/* ---- mamba.c: Jamba's selective scan */
int llmp_mamba1(const float *proj, int64_t ld, const float *conv, const float *conv_bias, int kernel, float *tail, float *state, const float *x_proj, const float *dt_proj, const float *dt_bias, const float *decay, const float *d, const float *dt_norm, const float *b_norm, const float *c_norm, float eps, int T, int W, int N, int R, float *out);

/* ---- short_conv.c */
void llmp_short_conv(const float *proj, int64_t ld, const float *conv, int kernel, float *tail, int T, int W, float *out);

/* ---- mamba.c */
int llmp_mamba2(const float *proj, int64_t ld, const float *conv, const float *conv_bias, int kernel, float *tail, float *state, const float *decay, const float *dt_bias, const float *d, const float *norm, float eps, int T, int H, int P, int N, int G, float *out);

/* ---- deltanet.c */
int llmp_deltanet(const float *mixed, int64_t ld_mixed, const float *z, int64_t ld_z, const float *x, int64_t ld_x, int hidden, const float *ba, const float *conv, int kernel, float *tail, float *state, const float *decay, const float *dt_bias, const float *norm, float eps, int T, int KH, int H, int K, int V, float *out);

/* ---- layers.c: whole steps of a layer stack */
int64_t llmp_decode_workspace(int B, int hidden, int heads, int kv_heads, int D, int inter, int mla, int E, int K, int I);
int llmp_decode_layers(const QLayer *layers, int n_layers, float *h, int B, int hidden, int heads, int kv_heads, int D, int inter, float eps, int R, float scale, int act, const KVC *cache, const int64_t *slots, const int64_t *positions, float *work, float *moe_work, const float *final_norm, const QLin *head, float *logits);
int llmp_decode_tokens(const DecodeCtx *c, const KVC *cache, const int64_t *tokens, const int64_t *slots, int B, int64_t *lengths, float *h, int64_t *positions, float *work, float *moe_work, float *logits);
int llmp_prefill_layers(const QLayer *layers, int n_layers, float *h, int B, int hidden, int heads, int kv_heads, int D, int inter, float eps, int R, float scale, int act, const KVC *cache, int nc, const int64_t *slot, const int64_t *start, const int64_t *T, const int64_t *row0, const int64_t *full, int nd, const int64_t *dslot, const int64_t *positions, float *work, float *moe_work);

/* ---- tokens.c */
int64_t llmp_argmax(const float *x, int64_t n);
void llmp_choose_tokens(const float *logits, int64_t rows, int64_t vocab, const float *it, const int64_t *top_k, const double *top_p, const double *u, int64_t *out);

/* ---- divergence.c: eval's per-token figures */
void llmp_log_softmax_rows(float *x, int64_t rows, int64_t vocab);
void llmp_divergence_rows(const float *ref, const float *cand, int64_t rows, int64_t vocab, double *kl, double *lse, int64_t *top);

/* ---- gptq.c and scale_search.c: compression's loops */
void llmp_gptq_columns(float *wb, int rows, int ldw, int j0, int j1, int nb, const float *hinv, int ldh, const float *scale, const float *zero, int lds, int scs, float qmin, float qmax, int8_t *q, int ldq, float *err, int lde);
void llmp_scale_search(const float *w, int rows, int cols, int group, const float *d, const float *s, const float *z, int n, float qmin, float qmax, float *err, int32_t *best);

#endif
