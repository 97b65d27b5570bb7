/* A whole decode or prefill step of a layer stack in one call.
 * For models whose block linears are all packed (outlier columns and biases allowed):
 * Python's per-operation overhead is then paid once per step instead of some forty times
 * per layer. A packed head (and the final norm) runs in the same call, logits out. Same
 * arithmetic as the per-op path. What differs between families arrives as data
 * (compress/model/spec.py's BlockSpec, read by compress/runtime/backends.py): norm
 * weights already in their effective form (gemma's 1 + w), optional q/k and sandwich norms
 * (NULL when absent), biases, each layer's rope tables and sliding window, the attention
 * scale and the activation. */
#include "internal.h"

static int widest_row(int hidden, int heads, int D, int inter) {
    int hp = (hidden + 31) / 32 * 32, ap = (heads * D + 31) / 32 * 32, ip = (inter + 31) / 32 * 32;
    int widest = hp > ap ? hp : ap;
    return widest > ip ? widest : ip;
}

static int64_t dense_workspace(int B, int hidden, int heads, int kv_heads, int D, int inter,
                               int mla) {
    int widest = widest_row(hidden, heads, D, inter), nqkv = (heads + 2 * kv_heads) * D;
    /* q/k/v twice (as the linear gives them, then apart), an output gate's heads * D
     * (QLayer.gated) beside the first */
    return (int64_t)B * (widest + 2 * (widest / 32) + 2 * nqkv + 2 * heads * D + 2 * inter + hidden + mla)
           + (int64_t)B * widest / 4 + 16;
}

/* Floats of the step workspace llmp_decode_layers needs at batch B: fp32 rows, block
 * scales and sums, projections, int8 codes, `mla` floats a row for latent attention's
 * (QMla; 0 without), and the experts' scratch (E experts, top K, width I; E = 0 without
 * experts). The caller owns it (allocated once per batch size, not
 * once per step: a fresh megabyte each step is an mmap and its page faults). */
int64_t llmp_decode_workspace(int B, int hidden, int heads, int kv_heads, int D, int inter,
                              int mla, int E, int K, int I) {
    return dense_workspace(B, hidden, heads, kv_heads, D, inter, mla) + moe_workspace(B, hidden, E, K, I);
}

/* A prefill step's chunks for run_layers (NULL for a decode step): chunk i is T[i] rows
 * of the sequence in slot[i] at positions start[i].., rows row0[i].. of the step; full[i],
 * when not 0, the address of its prompt's k/v in full precision, [2, cached layers, kv_heads,
 * start + T, D] fp32, positions 0..start - 1 filled (a quantized cache's chunked prompt
 * attends as one prefilled whole would). The step's last nd rows, after every chunk's, are
 * decode rows of the sequences in dslot: each attends through the cache as a decode step's
 * row does, so the weights are read once for a step's prefill and decoding alike. */
typedef struct {
    int nc, layers;
    const int64_t *slot, *start, *T, *row0, *full;
    int nd;
    const int64_t *dslot;
} Spans;

static int prefill_attend(const KVC *c, int layer, const float *q, const float *kn,
                          const float *vn, const Spans *sp, int heads, int D, float scale,
                          int window, float softcap, const float *sinks, float *att);

/* What a branch's linears read: h normed by `norm` and quantized, or (no norm: olmo2) h as
 * it is, quantized; the residual h itself unchanged. */
static void branch_input(const float *h, const float *norm, float eps, int center, int B,
                         int hidden, int hp, float *pad, int8_t *x8, float *dx, float *bs) {
    if (norm)
        llmp_rmsnorm_quant(h, norm, eps, center, B, hidden, hp, pad, x8, dx, bs);
    else
        quantize_rows_padded(h, B, hidden, hidden, hp, pad, x8, dx, bs);
}

/* Each head's linear lins[h] on its own B rows, x + h * step + b * ld (K floats each), in
 * one grouped pass: y holds head h's products [B, n] at h * B * n. The rows are quantized
 * into pad/x8/dx/bs, head after head (Kp floats a row, K rounded up to 32). */
static int head_products(const QLin *lins, int heads, const float *x, int step, int ld, int K,
                         int Kp, int B, float *pad, int8_t *x8, float *dx, float *bs, float *y) {
    GemmJob jobs[heads];
    for (int hd = 0; hd < heads; hd++) {
        int64_t r = (int64_t)hd * B;
        quantize_rows_padded(x + (int64_t)hd * step, B, K, ld, Kp, pad + r * Kp, x8 + r * Kp,
                             dx + r * (Kp / 32), bs + r * (Kp / 32));
        jobs[hd] = (GemmJob){lins + hd, x8 + r * Kp, dx + r * (Kp / 32), bs + r * (Kp / 32),
                             pad + r * Kp, B, y + r * lins[hd].n};
    }
    return gemm_jobs(jobs, heads);
}

/* Floats a row of MLA's norm inputs: the latent's, or q_a's where wider. */
static int mla_normed(const QMla *m) {
    return m->q_norm && m->q_width > m->kv_rank ? m->q_width : m->kv_rank;
}

/* MLA's q [B, heads, D] and its one cached head k, v [B, 1, D] (D = rope + kv_rank) from
 * the qkv linear's rows [B, width] (QMla): the key is the rotated part beside the normed
 * latent, the value zeros beside the latent; each head's query is its rotated part beside
 * its unrotated part through uk[h]. `work` holds B rows of the norms' inputs then every
 * head's products (the workspace's `mla` floats a row), `qo` q_b's output (attention's
 * output buffer, free until attention). */
static int mla_qkv(const QMla *m, const float *qkv, int B, int width, int heads, int D,
                   float *pad, int8_t *x8, float *dx, float *bs, float *work, float *qo,
                   float *q, float *kn, float *vn) {
    int QD = m->nope + m->rope, R = m->rope, C = m->kv_rank;
    float *rows = work, *y = work + (int64_t)B * mla_normed(m);
    const float *qs = qkv;
    int qstride = width;
    if (m->q_norm) {
        int qp = (m->q_width + 31) / 32 * 32;
        for (int b = 0; b < B; b++)
            memcpy(rows + (int64_t)b * m->q_width, qkv + (int64_t)b * width, m->q_width * sizeof(float));
        llmp_rmsnorm_quant(rows, m->q_norm, m->eps, 0, B, m->q_width, qp, pad, x8, dx, bs);
        if (qlin(&m->q_b, x8, dx, bs, B, qo, pad, qp)) return -1;
        qs = qo;
        qstride = heads * QD;
    }
    for (int b = 0; b < B; b++)
        memcpy(rows + (int64_t)b * C, qkv + (int64_t)b * width + m->q_width, C * sizeof(float));
    rms_rows(rows, B, C, m->kv_norm, 1, m->eps, 0, B >= PAR_ROWS);
    for (int b = 0; b < B; b++) { /* v: zeros where k is rotated (o never reads them, and
                                     * rotated keys would only widen a quantized row) */
        float *kh = kn + (int64_t)b * D, *vh = vn + (int64_t)b * D;
        memcpy(kh, qkv + (int64_t)b * width + m->q_width + C, R * sizeof(float));
        memcpy(kh + R, rows + (int64_t)b * C, C * sizeof(float));
        memset(vh, 0, R * sizeof(float));
        memcpy(vh + R, rows + (int64_t)b * C, C * sizeof(float));
    }
    int np = (m->nope + 31) / 32 * 32;
    if (head_products(m->uk, heads, qs + R, QD, qstride, m->nope, np, B, pad, x8, dx, bs, y))
        return -1;
    for (int b = 0; b < B; b++)
        for (int hd = 0; hd < heads; hd++) {
            float *qh = q + ((int64_t)b * heads + hd) * D;
            memcpy(qh, qs + (int64_t)b * qstride + (int64_t)hd * QD, R * sizeof(float));
            memcpy(qh + R, y + ((int64_t)hd * B + b) * C, C * sizeof(float));
        }
    return 0;
}

/* o's input [B, heads * v] from MLA's attention output att [B, heads, D]: each head's
 * weighted latent (past its rotated part) through uv[h]; `y` every head's products. */
static int mla_values(const QMla *m, const float *att, int B, int heads, int D, float *pad,
                      int8_t *x8, float *dx, float *bs, float *y, float *out) {
    int C = m->kv_rank, V = m->v, cp = (C + 31) / 32 * 32;
    if (head_products(m->uv, heads, att + m->rope, D, heads * D, C, cp, B, pad, x8, dx, bs, y))
        return -1;
    for (int b = 0; b < B; b++)
        for (int hd = 0; hd < heads; hd++)
            memcpy(out + ((int64_t)b * heads + hd) * V, y + ((int64_t)hd * B + b) * V, V * sizeof(float));
    return 0;
}

/* Every block over h [B, hidden] (then, with `head`, the final norm and logits): B decode
 * rows (sp NULL: each at its own slot and position, attending through the cache), or a
 * prefill step's chunks (sp: each causal within itself, over its cached prefix).
 * Everything but attention is the same code, so prefill and decode rows round alike. */
/* One sequence's rows r0..r0 + T - 1 of a DeltaNet layer (from zeros where `fresh`): its
 * slot's tail and state continue in place. -1: out of memory. */
static int delta_rows(const QDelta *d, const float *qkv, int n, const float *x, int ldx,
                       int hidden, int64_t slot, int64_t r0, int64_t T, int fresh, float *att) {
    int keys = 2 * d->k_heads * d->k_dim, width = d->v_heads * d->v_dim;
    float *tail = d->tail + slot * d->tail_stride, *state = d->state + slot * d->state_stride;
    if (fresh) {
        memset(tail, 0, sizeof(float) * (size_t)d->tail_stride);
        memset(state, 0, sizeof(float) * (size_t)d->state_stride);
    }
    return llmp_deltanet(qkv + r0 * n, n, qkv + r0 * n + keys + width, n, x + r0 * ldx, ldx, hidden,
                  d->ba, d->conv, d->kernel, tail, state, d->decay, d->dt_bias, d->norm, d->eps,
                  (int)T, d->k_heads, d->v_heads, d->k_dim, d->v_dim, att + r0 * width);
}

/* The same of a Mamba-2 layer: in_proj's rows r0.. of one sequence. */
static int mamba_rows(const QMamba *m, const float *proj, int n, int64_t slot, int64_t r0,
                      int64_t T, int fresh, float *att) {
    int width = m->heads * m->head_dim;
    float *tail = m->tail + slot * m->tail_stride, *state = m->state + slot * m->state_stride;
    if (fresh) {
        memset(tail, 0, sizeof(float) * (size_t)m->tail_stride);
        memset(state, 0, sizeof(float) * (size_t)m->state_stride);
    }
    return llmp_mamba2(proj + r0 * n, n, m->conv, m->conv_bias, m->kernel, tail, state, m->decay,
                       m->dt_bias, m->d, m->norm, m->eps, (int)T, m->heads, m->head_dim,
                       m->state_size, m->groups, att + r0 * width);
}

/* The same of a short convolution: in_proj's rows r0.. of one sequence. */
static int conv_rows(const QConv *c, const float *proj, int n, int64_t slot, int64_t r0,
                     int64_t T, int fresh, float *att) {
    float *tail = c->tail + slot * c->tail_stride;
    if (fresh) memset(tail, 0, sizeof(float) * (size_t)c->tail_stride);
    llmp_short_conv(proj + r0 * n, n, c->conv, c->kernel, tail, (int)T, c->width, att + r0 * c->width);
    return 0;
}

/* The same of Jamba's Mamba: in_proj's rows r0.. of one sequence. */
static int mamba1_rows(const QMamba1 *m, const float *proj, int n, int64_t slot, int64_t r0,
                       int64_t T, int fresh, float *att) {
    float *tail = m->tail + slot * m->tail_stride, *state = m->state + slot * m->state_stride;
    if (fresh) {
        memset(tail, 0, sizeof(float) * (size_t)m->tail_stride);
        memset(state, 0, sizeof(float) * (size_t)m->state_stride);
    }
    return llmp_mamba1(proj + r0 * n, n, m->conv, m->conv_bias, m->kernel, tail, state, m->x_proj,
                       m->dt_proj, m->dt_bias, m->decay, m->d, m->dt_norm, m->b_norm, m->c_norm,
                       m->eps, (int)T, m->width, m->state_size, m->rank, att + r0 * m->width);
}

static int recurrent(const QLayer *L) { return L->delta || L->mamba || L->conv || L->mamba1; }

/* What a recurrent layer's mixing gives o a row: a DeltaNet's, a Mamba's or a short
 * convolution's width. */
static int mixer_width(const QLayer *L) {
    if (L->delta) return L->delta->v_heads * L->delta->v_dim;
    if (L->mamba1) return L->mamba1->width;
    return L->mamba ? L->mamba->heads * L->mamba->head_dim : L->conv->width;
}

static int mixer_rows(const QLayer *L, const float *qkv, int n, const float *x, int ldx,
                      int hidden, int64_t slot, int64_t r0, int64_t T, int fresh, float *att) {
    if (L->delta) return delta_rows(L->delta, qkv, n, x, ldx, hidden, slot, r0, T, fresh, att);
    if (L->mamba) return mamba_rows(L->mamba, qkv, n, slot, r0, T, fresh, att);
    if (L->mamba1) return mamba1_rows(L->mamba1, qkv, n, slot, r0, T, fresh, att);
    return conv_rows(L->conv, qkv, n, slot, r0, T, fresh, att);
}

/* A recurrent layer's branch (a DeltaNet's, a Mamba's) on the step's normed rows xn (and
 * their codes): its qkv product, each sequence's mixing (a decode step's rows one token
 * of slots[b] each; a prefill step's chunks, then its decode rows), and o on that, into
 * out [B, hidden]. `buf`: mixer_floats' floats. -1: out of memory. */
static int mixer_branch(const QLayer *L, int B, int hidden, int hp, const float *xn,
                        int8_t *x8, float *dx, float *bs, const int64_t *slots, const Spans *sp,
                        float *buf, float *out) {
    int n = L->qkv.n, width = mixer_width(L), wp = (width + 31) / 32 * 32;
    float *qkv = buf, *att = qkv + (int64_t)B * n, *pad = att + (int64_t)B * width;
    float *ddx = pad + (int64_t)B * wp, *dbs = ddx + (int64_t)B * (wp / 32);
    int8_t *dx8 = (int8_t *)(dbs + (int64_t)B * (wp / 32));
    if (qlin(&L->qkv, x8, dx, bs, B, qkv, xn, hp)) return -1;
    if (sp == NULL) {
        for (int b = 0; b < B; b++)
            if (mixer_rows(L, qkv, n, xn, hp, hidden, slots[b], b, 1, 0, att)) return -1;
    } else {
        for (int i = 0; i < sp->nc; i++)
            if (mixer_rows(L, qkv, n, xn, hp, hidden, sp->slot[i], sp->row0[i], sp->T[i],
                           sp->start[i] == 0, att))
                return -1;
        for (int j = 0; j < sp->nd; j++)
            if (mixer_rows(L, qkv, n, xn, hp, hidden, sp->dslot[j], B - sp->nd + j, 1, 0, att))
                return -1;
    }
    quantize_rows_padded(att, B, width, width, wp, pad, dx8, ddx, dbs);
    return qlin(&L->o, dx8, ddx, dbs, B, out, pad, wp);
}

/* Floats of mixer_branch's scratch at B rows for the widest recurrent layer of the stack
 * (0: none). */
static int64_t mixer_floats(const QLayer *layers, int n_layers, int B) {
    int64_t most = 0;
    for (int l = 0; l < n_layers; l++) {
        if (!recurrent(layers + l)) continue;
        int64_t width = mixer_width(layers + l), wp = (width + 31) / 32 * 32;
        int64_t f = (int64_t)B * (layers[l].qkv.n + width + wp + 2 * (wp / 32) + wp / 4 + 1);
        if (f > most) most = f;
    }
    return most;
}

static int run_layers(const QLayer *layers, int n_layers, float *h, int B, int hidden,
                      int heads, int kv_heads, int D, int inter, float eps, int R, float scale,
                      int act, const KVC *cache, const int64_t *slots,
                      const int64_t *positions, float *work, float *moe_work,
                      const float *final_norm, const QLin *head, float *logits,
                      const Spans *sp) {
    int hp = (hidden + 31) / 32 * 32, ap = (heads * D + 31) / 32 * 32, ip = (inter + 31) / 32 * 32;
    int widest = widest_row(hidden, heads, D, inter);
    int nqkv = (heads + 2 * kv_heads) * D, room = nqkv + heads * D; /* room: with a gate */
    float *pad = work;
    float *dx = pad + (int64_t)B * widest;
    float *bs = dx + (int64_t)B * (widest / 32);
    float *qkv = bs + (int64_t)B * (widest / 32);
    float *att = qkv + (int64_t)B * room;
    float *gu = att + (int64_t)B * heads * D;
    float *tmp = gu + (int64_t)B * 2 * inter;
    int8_t *x8 = (int8_t *)(tmp + (int64_t)B * hidden);
    float *q = (float *)(x8 + (int64_t)B * widest);  /* contiguous q, k, v for attention */
    float *kn = q + (int64_t)B * heads * D;
    float *vn = kn + (int64_t)B * kv_heads * D;
    float *mla_work = vn + (int64_t)B * kv_heads * D; /* the `mla` floats a row (QMla) */
    int64_t mixer_n = mixer_floats(layers, n_layers, B);
    float *mixer_buf = mixer_n ? malloc(sizeof(float) * (size_t)mixer_n) : NULL;
    if (mixer_n && mixer_buf == NULL) return -1;
    int l = 0;
    for (; l < n_layers; l++) {
        const QLayer *L = layers + l;
        branch_input(h, L->attn_norm, eps, L->center, B, hidden, hp, pad, x8, dx, bs);
        if (recurrent(L)) {
            if (mixer_branch(L, B, hidden, hp, pad, x8, dx, bs, slots, sp, mixer_buf, tmp)) break;
        } else {
            if (qlin(&L->qkv, x8, dx, bs, B, qkv, pad, hp)) break;
            if (L->mla) {
                if (mla_qkv(L->mla, qkv, B, L->qkv.n, heads, D, pad, x8, dx, bs, mla_work, att, q, kn, vn))
                    break;
            } else {
                #pragma omp parallel for schedule(static) if (B >= PAR_ROWS)
                for (int b = 0; b < B; b++) {
                    const float *row = qkv + (int64_t)b * L->qkv.n;
                    memcpy(q + (int64_t)b * heads * D, row, heads * D * sizeof(float));
                    memcpy(kn + (int64_t)b * kv_heads * D, row + heads * D, kv_heads * D * sizeof(float));
                    memcpy(vn + (int64_t)b * kv_heads * D, row + (heads + kv_heads) * D, kv_heads * D * sizeof(float));
                }
            }
            /* q/k norms: over each head (one weight, or each head's own), or all of a row's */
            int qw = L->qk_full ? heads * D : D, kw = L->qk_full ? kv_heads * D : D;
            int qr = L->qk_each ? heads : 1, kr = L->qk_each ? kv_heads : 1, c = L->center;
            if (L->q_norm && !L->qk_after_rope) { /* before rope (olmo2's: a row's heads at once) */
                rms_rows(q, (int64_t)B * heads * D / qw, qw, L->q_norm, qr, eps, c, B >= PAR_ROWS);
                rms_rows(kn, (int64_t)B * kv_heads * D / kw, kw, L->k_norm, kr, eps, c, B >= PAR_ROWS);
            }
            llmp_rope(q, positions, L->cos, L->sin, B, heads, D, R);
            llmp_rope(kn, positions, L->cos, L->sin, B, kv_heads, D, R);
            if (L->q_norm && L->qk_after_rope) { /* hunyuan: per head, after rope */
                rms_rows(q, (int64_t)B * heads, D, L->q_norm, qr, eps, c, B >= PAR_ROWS);
                rms_rows(kn, (int64_t)B * kv_heads, D, L->k_norm, kr, eps, c, B >= PAR_ROWS);
            }
            if (L->q_scale)
                for (int b = 0; b < B; b++) {
                    float f = L->q_scale[positions[b]], *qb = q + (int64_t)b * heads * D;
                    for (int i = 0; i < heads * D; i++) qb[i] *= f;
                }
            if (sp == NULL) {
                if (llmp_decode_attention(cache, L->kv_layer, q, kn, vn, slots, positions, B, heads, scale, L->window,
                                          L->softcap, att, L->sinks))
                    break;
            } else {
                int64_t P = B - sp->nd; /* the chunks' rows; the decode rows follow them */
                if (sp->nc && prefill_attend(cache, L->kv_layer, q, kn, vn, sp, heads, D, scale, L->window, L->softcap,
                                             L->sinks, att))
                    break;
                if (sp->nd && llmp_decode_attention(cache, L->kv_layer, q + P * heads * D, kn + P * kv_heads * D,
                                                    vn + P * kv_heads * D, sp->dslot, positions + P,
                                                    sp->nd, heads, scale, L->window, L->softcap,
                                                    att + P * heads * D, L->sinks))
                    break;
            }
            int ow = heads * D, op = ap; /* o reads each head's output (MLA's: its v) */
            const float *o_in = att;
            if (L->gated) /* each output value times the sigmoid of its gate value */
                gate_rows(att, B, heads * D, qkv + nqkv, L->qkv.n, B >= PAR_ROWS);
            if (L->mla) {
                float *y = mla_work + (int64_t)B * mla_normed(L->mla), *vals = q; /* q: read */
                if (mla_values(L->mla, att, B, heads, D, pad, x8, dx, bs, y, vals)) break;
                ow = heads * L->mla->v;
                op = (ow + 31) / 32 * 32;
                o_in = vals;
            }
            quantize_rows_padded(o_in, B, ow, ow, op, pad, x8, dx, bs);
            if (qlin(&L->o, x8, dx, bs, B, tmp, pad, op)) break;
        }
        if (L->post_attn_norm)
            rms_rows(tmp, B, hidden, L->post_attn_norm, 1, eps, L->center, B >= PAR_ROWS);
        if (L->parallel) /* the MLP's input from h before attention's output joins it */
            branch_input(h, L->mlp_norm, eps, L->center, B, hidden, hp, pad, x8, dx, bs);
        add_rows(h, tmp, (int64_t)B * hidden, L->residual, B >= PAR_ROWS);
        if (!L->parallel)
            branch_input(h, L->mlp_norm, eps, L->center, B, hidden, hp, pad, x8, dx, bs);
        if (L->moe) {
            if (moe_mlp(L->moe, B, hidden, act, pad, x8, dx, bs, tmp, moe_work)) break;
        } else {
            if (qlin(&L->gate_up, x8, dx, bs, B, gu, pad, hp)) break;
            if (L->ungated)
                llmp_act_quant(gu, B, inter, ip, act, L->act_params, pad, x8, dx, bs);
            else
                llmp_act_mul_quant(gu, B, inter, ip, act, pad, x8, dx, bs);
            if (qlin(&L->down, x8, dx, bs, B, tmp, pad, ip)) break;
        }
        if (L->post_mlp_norm)
            rms_rows(tmp, B, hidden, L->post_mlp_norm, 1, eps, L->center, B >= PAR_ROWS);
        add_rows(h, tmp, (int64_t)B * hidden, L->residual, B >= PAR_ROWS);
    }
    free(mixer_buf);
    if (l < n_layers) return -1;
    if (head == NULL) return 0;
    /* the final norm and a packed head: h stays the last block's output */
    llmp_rmsnorm_quant(h, final_norm, eps, layers[n_layers - 1].center, B, hidden, hp, pad, x8,
                       dx, bs);
    return qlin(head, x8, dx, bs, B, logits, pad, hp);
}

int llmp_decode_layers(const QLayer *layers, int n_layers, float *h, int B, int hidden,
                        int heads, int kv_heads, int D, int inter, float eps, int R,
                        float scale, int act, const KVC *cache, const int64_t *slots,
                        const int64_t *positions, float *work, float *moe_work,
                        const float *final_norm, const QLin *head, float *logits) {
    return run_layers(layers, n_layers, h, B, hidden, heads, kv_heads, D, inter, eps, R, scale,
                      act, cache, slots, positions, work, moe_work, final_norm, head, logits,
                      NULL);
}

/* logits [B, vocab] for the next token of the sequences in `slots`, whose last tokens are
 * `tokens`: each at position lengths[slot], whose k/v it stores; lengths[slot] then grows
 * by one. h [B, hidden] and positions [B] are scratch. One call where Python otherwise
 * makes a dozen torch operations, each slow after the step has streamed the weights
 * through the caches (cold code and data: 50-150 us each). */
int llmp_decode_tokens(const DecodeCtx *c, const KVC *cache, const int64_t *tokens,
                       const int64_t *slots, int B, int64_t *lengths, float *h,
                       int64_t *positions, float *work, float *moe_work, float *logits) {
    int H = c->hidden;
    for (int b = 0; b < B; b++) {
        positions[b] = lengths[slots[b]];
        float *row = h + (int64_t)b * H;
        if (c->embed_kind == 0) {
            const float *e = (const float *)c->embed + tokens[b] * H;
            for (int d = 0; d < H; d++) row[d] = e[d] * c->embed_scale;
        } else {
            const uint16_t *e = (const uint16_t *)c->embed + tokens[b] * H;
            for (int d = 0; d < H; d++) row[d] = widen16(e[d], c->embed_kind) * c->embed_scale;
        }
    }
    if (llmp_decode_layers(c->layers, c->n_layers, h, B, H, c->heads, c->kv_heads, c->D,
                           c->inter, c->eps, c->R, c->scale, c->act, cache, slots, positions,
                           work, moe_work, c->final_norm, c->head, logits))
        return -1;
    for (int b = 0; b < B; b++) lengths[slots[b]]++;
    return 0;
}

/* A prefill step's attention: each chunk attends to positions 0..start + T - 1 of its
 * sequence as the per-op path (runtime/model.py) does, and its rows are then stored in the
 * cache (a quantized cache quantizes each token group as it completes):
 * - with its prompt's k/v in full precision (Spans.full): its rows join them there, and it
 *   attends to them in place;
 * - else without a cached prefix: to its own rows in place;
 * - else to its prefix read back from the cache (an fp32 cache's blocks copied, a quantized
 *   one's dequantized) followed by its own rows, gathered into one buffer.
 * All chunks attend in one llmp_prefill_attention call: the same bits. -1: out of memory. */
static int prefill_attend(const KVC *c, int layer, const float *q, const float *kn,
                          const float *vn, const Spans *sp, int heads, int D, float scale,
                          int window, float softcap, const float *sinks, float *att) {
    int kvh = c->kv_heads, bsz = c->block, L_all = sp->layers;
    int64_t row = (int64_t)bsz * D, head = (int64_t)c->n_blocks * row;
    float *k0 = c->bits ? NULL : c->k + (int64_t)layer * kvh * head;
    float *v0 = c->bits ? NULL : c->v + (int64_t)layer * kvh * head;
    int64_t total = 0, qs = (int64_t)heads * D, rows = 0;
    for (int i = 0; i < sp->nc; i++) rows += sp->T[i];
    for (int i = 0; i < sp->nc; i++)
        if (sp->start[i] && !sp->full[i]) total += 2 * (int64_t)kvh * (sp->start[i] + sp->T[i]) * D;
    float *buf = malloc(sizeof(float) * (size_t)(total > 0 ? total : 1));
    PChunk *pc = malloc(sizeof(PChunk) * (size_t)(sp->nc > 0 ? sp->nc : 1));
    int64_t *off = malloc(sizeof(int64_t) * (size_t)(sp->nc + 1));
    if (buf == NULL || pc == NULL || off == NULL) {
        free(buf), free(pc), free(off);
        return -1;
    }
    off[0] = 0;
    for (int i = 0; i < sp->nc; i++) {
        int64_t start = sp->start[i], T = sp->T[i], L = start + T, r0 = sp->row0[i];
        const float *qi = q + r0 * qs;
        float *ai = att + r0 * qs;
        off[i + 1] = off[i] + (start && !sp->full[i] ? 2 * (int64_t)kvh * L * D : 0);
        if (sp->full[i]) {
            float *fk = (float *)(intptr_t)sp->full[i] + (int64_t)layer * kvh * L * D;
            float *fv = fk + (int64_t)L_all * kvh * L * D;
            pc[i] = (PChunk){qi, fk, fv, ai, qs, qs, L * D, D, L * D, D, (int)T, (int)start};
        } else if (start == 0) { /* its own rows as they are, [T, kv_heads, D] */
            pc[i] = (PChunk){qi, kn + r0 * kvh * D, vn + r0 * kvh * D, ai, qs, qs, D,
                             (int64_t)kvh * D, D, (int64_t)kvh * D, (int)T, 0};
        } else {
            float *ks = buf + off[i], *vs = ks + (int64_t)kvh * L * D;
            pc[i] = (PChunk){qi, ks, vs, ai, qs, qs, L * D, D, L * D, D, (int)T, (int)start};
        }
    }
    /* per (chunk, KV head): read its prefix back, place its rows, store them in the cache,
     * in that order (storing may quantize a group the prefix read from the residual) */
    int tasks = sp->nc * kvh;
    #pragma omp parallel for schedule(dynamic, 1) if (tasks > 1 && total + 2 * rows * kvh * D > 65536)
    for (int t = 0; t < tasks; t++) {
        int i = t / kvh, g = t % kvh;
        int64_t start = sp->start[i], T = sp->T[i], L = start + T, r0 = sp->row0[i];
        const int32_t *table = c->table + sp->slot[i] * c->max_blocks;
        float *dk = NULL, *dv = NULL; /* where this chunk attends to its rows, if a copy */
        if (sp->full[i]) {
            dk = (float *)pc[i].k + g * L * D, dv = (float *)pc[i].v + g * L * D;
        } else if (start) {
            dk = buf + off[i] + g * L * D, dv = dk + (int64_t)kvh * L * D;
            if (c->bits)
                kv_dequant(c, layer, sp->slot[i], g, start, dk, dv);
            else
                for (int64_t p = 0; p < start; p += bsz) { /* a block's run at a time */
                    int64_t n = start - p < bsz ? start - p : bsz, from = g * head + table[p / bsz] * row;
                    memcpy(dk + p * D, k0 + from, n * D * sizeof(float));
                    memcpy(dv + p * D, v0 + from, n * D * sizeof(float));
                }
        }
        for (int64_t r = 0; r < T; r++) {
            const float *kr = kn + ((r0 + r) * kvh + g) * D, *vr = vn + ((r0 + r) * kvh + g) * D;
            if (dk) {
                memcpy(dk + (start + r) * D, kr, D * sizeof(float));
                memcpy(dv + (start + r) * D, vr, D * sizeof(float));
            }
            kv_write(c, layer, sp->slot[i], start + r, g, kr, vr);
        }
    }
    int rc = llmp_prefill_attention(pc, sp->nc, heads, kvh, D, scale, window, softcap, sinks);
    free(buf), free(pc), free(off);
    return rc;
}

/* Every block of a prefill step in one C call (llmp_decode_layers' code, with the causal
 * prefill attention): h [B, hidden] holds the step's rows, chunk by chunk (chunk i: T[i]
 * rows of the sequence in slot[i] at positions start[i]..., their blocks prepared; full[i]:
 * see Spans), then nd decode rows of the sequences in dslot (each at its position, its
 * block prepared), and is left holding the last block's output; positions [B] are the
 * rows' own. Any cache kind; -1: out of memory. */
int llmp_prefill_layers(const QLayer *layers, int n_layers, float *h, int B, int hidden,
                        int heads, int kv_heads, int D, int inter, float eps, int R,
                        float scale, int act, const KVC *cache, int nc, const int64_t *slot,
                        const int64_t *start, const int64_t *T, const int64_t *row0,
                        const int64_t *full, int nd, const int64_t *dslot,
                        const int64_t *positions, float *work, float *moe_work) {
    int cached = 0; /* the layers `full` holds: the cache's */
    for (int l = 0; l < n_layers; l++) cached += !recurrent(layers + l);
    Spans sp = {nc, cached, slot, start, T, row0, full, nd, dslot};
    return run_layers(layers, n_layers, h, B, hidden, heads, kv_heads, D, inter, eps, R, scale,
                      act, cache, NULL, positions, work, moe_work, NULL, NULL, NULL, &sp);
}
