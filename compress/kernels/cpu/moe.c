/* Mixture-of-Experts MLPs: routing, the experts a step chose, a shared expert. */
#include "internal.h"

/* gate [B] = sigmoid(w . x_b) for rows xf [B, ld]: the shared expert's gate, the same dot
 * product in the one-call decoder and the per-op path. */
void llmp_sigmoid_gate(const float *xf, int B, int ld, const float *w, int hidden, float *gate) {
    for (int b = 0; b < B; b++)
        gate[b] = 1.f / (1.f + expf(-dot_f32(xf + (int64_t)b * ld, w, hidden)));
}

/* PhiMoE's sparsemixer outside training, for one row of logits p [E]: the arg max (ties:
 * the lower index), weighted by the softmax over the experts whose logit s is within
 * (max - s) / max(|s|, max) <= 2 jitter of it, evaluated at it; then the same over the
 * other experts for the second pick. Not renormalized (the two need not sum to 1). */
static void sparsemixer(const float *p, int E, float jitter, int32_t *c, float *cw) {
    for (int k = 0; k < 2; k++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if ((k == 0 || e != c[0]) && (best < 0 || p[e] > p[best])) best = e;
        float top = p[best], sum = 0.f;
        for (int e = 0; e < E; e++) {
            float factor = fabsf(p[e]) > top ? fabsf(p[e]) : top;
            if ((k == 0 || e != c[0]) && !((top - p[e]) / factor > 2.f * jitter))
                sum += expf(p[e] - top);
        }
        c[k] = best, cw[k] = 1.f / sum;
    }
}

/* Routing of B rows xf [B, ld] by an fp32 router [E, hidden]: each expert's score is the
 * softmax of the logits, or with `scoring` 1 each logit's sigmoid (glm4_moe), or with 2
 * PhiMoE's sparsemixer (K = 2; everything after the logits is its own); the top K
 * scores (ties: the lower index) are chosen, each plus bias[e] where a bias is given
 * (e_score_correction_bias: it steers the choice, not the weights; with `scoring` 3 the
 * logits plus bias choose and the chosen logits' sigmoids weigh: Kolibri's), and with
 * n_group > 1 only from the topk_group of n_group groups of experts whose best two choice scores sum
 * highest (DeepSeek-V3's), or whose best one is highest (`group_max`: V2's); the chosen
 * scores, renormalized to sum to 1 when asked, times `scale`, are the weights. logits
 * [B, E] is scratch (the router's products plus router_bias, where given); choice and
 * weight [B, K] the result. */
void llmp_route(const float *xf, int B, int ld, const float *router, const float *router_bias,
                int E, int hidden, int K,
                int renorm, int scoring, float jitter, const float *bias, float scale,
                int n_group, int topk_group, int group_max, float *logits, int32_t *choice,
                float *weight) {
    int sigmoid = scoring == 1, on_logits = scoring == 3;
    #pragma omp parallel for schedule(static) if ((int64_t)B * E * hidden > 65536)
    for (int64_t i = 0; i < (int64_t)B * E; i++)
        logits[i] = dot_f32(xf + (i / E) * ld, router + (i % E) * hidden, hidden)
                    + (router_bias ? router_bias[i % E] : 0.f);
    for (int b = 0; b < B; b++) {
        float *p = logits + (int64_t)b * E, mx = p[0], sum = 0.f, chosen = 0.f;
        int32_t *c = choice + (int64_t)b * K;
        float *cw = weight + (int64_t)b * K;
        if (scoring == 2) {
            sparsemixer(p, E, jitter, c, cw);
            continue;
        }
        if (sigmoid) {
            for (int e = 0; e < E; e++) p[e] = 1.f / (1.f + expf(-p[e]));
        } else if (!on_logits) { /* on_logits: p keeps them; the chosen's sigmoids weigh */
            for (int e = 1; e < E; e++) mx = p[e] > mx ? p[e] : mx;
            for (int e = 0; e < E; e++) sum += (p[e] = expf(p[e] - mx));
            if (bias) /* the scores themselves, to add the bias to */
                for (int e = 0; e < E; e++) p[e] /= sum;
        }
        unsigned char open[E]; /* the experts of the chosen groups */
        memset(open, n_group > 1 ? 0 : 1, (size_t)E);
        if (n_group > 1) {
            int per = E / n_group, gtaken[n_group];
            float gs[n_group];
            for (int g = 0; g < n_group; g++) { /* its best choice score, and its second */
                float a = -INFINITY, b2 = -INFINITY;
                for (int e = g * per; e < (g + 1) * per; e++) {
                    float s = bias ? p[e] + bias[e] : p[e];
                    if (s > a) b2 = a, a = s;
                    else if (s > b2) b2 = s;
                }
                gs[g] = group_max ? a : a + b2, gtaken[g] = 0;
            }
            for (int k = 0; k < topk_group; k++) {
                int best = -1;
                for (int g = 0; g < n_group; g++)
                    if (!gtaken[g] && (best < 0 || gs[g] > gs[best])) best = g;
                gtaken[best] = 1;
                memset(open + best * per, 1, (size_t)per);
            }
        }
        for (int k = 0; k < K; k++) { /* top K by repeated arg max */
            int best = -1;
            float top = 0.f;
            for (int e = 0; e < E; e++) {
                int taken = !open[e];
                for (int j = 0; j < k; j++) taken |= c[j] == e;
                float s = bias ? p[e] + bias[e] : p[e];
                if (!taken && (best < 0 || s > top)) best = e, top = s;
            }
            c[k] = best;
            cw[k] = on_logits           ? 1.f / (1.f + expf(-p[best]))
                    : sigmoid || bias ? p[best]
                                      : p[best] / sum;
            chosen += cw[k];
        }
        if (renorm)
            for (int k = 0; k < K; k++) cw[k] /= chosen;
        if (scale != 1.f)
            for (int k = 0; k < K; k++) cw[k] *= scale;
    }
}

/* Floats the experts' scratch takes at batch B (none without experts): router logits and
 * choices, then for every (row, chosen expert) pair, B * K rows: its gathered input (fp32,
 * int8 and block scales), gate/up, activation and output. I: the wider of an expert and a
 * shared expert. */
int64_t moe_workspace(int B, int hidden, int E, int K, int I) {
    if (E == 0) return 0;
    int64_t R = (int64_t)B * K, hp = (hidden + 31) / 32 * 32, ip = (I + 31) / 32 * 32;
    return (int64_t)B * E + 2 * (int64_t)B * K + 2 * R
           + R * (hp + hp / 16 + 2 * (int64_t)I + ip + ip / 16 + hidden) + R * (hp + ip) / 4 + 16;
}

/* out [B, hidden] = the experts' MLP of the normed rows xf [B, hp] (quantized: x8/dx/bs).
 * The rows routed to each chosen expert are gathered side by side; every chosen expert's
 * gate_up runs in one grouped pass, the activation over all their rows at once, then every
 * down in one pass. Experts add their weighted rows in index order, as the per-op path
 * does. */
int moe_mlp(const QMoe *M, int B, int hidden, int act, const float *xf,
            const int8_t *x8, const float *dx, const float *bs, float *out, float *w) {
    int E = M->n_experts, K = M->top_k, I = M->inter, S = M->shared ? M->shared_inter : 0;
    int W = I > S ? I : S; /* the scratch holds the wider of an expert and the shared one */
    int hp = (hidden + 31) / 32 * 32, ip = (I + 31) / 32 * 32, sp = (S + 31) / 32 * 32;
    int wp = (W + 31) / 32 * 32, nbh = hp / 32, nbi = wp / 32;
    int64_t R = (int64_t)B * K;
    float *logits = w, *cw = logits + (int64_t)B * E, *rw = cw + R;
    int32_t *choice = (int32_t *)(rw + R), *rows = choice + R;
    float *gpad = (float *)(rows + R), *gdx = gpad + R * hp, *gbs = gdx + R * nbh;
    float *gu = gbs + R * nbh, *apad = gu + R * 2 * W;
    float *adx = apad + R * wp, *abs_ = adx + R * nbi;
    float *y = abs_ + R * nbi;
    int8_t *gx8 = (int8_t *)(y + R * hidden), *ax8 = gx8 + R * hp;
    llmp_route(xf, B, hp, M->router, M->router_bias, E, hidden, K, M->renorm, M->scoring, M->jitter,
               M->choice_bias, M->scale, M->n_group, M->topk_group, M->group_max, logits, choice,
               cw);
    int starts[E + 1], used[E], n_used = 0, n = 0;
    GemmJob jobs[E];
    for (int e = 0; e < E; e++) { /* gather: expert e's rows at starts[e].. */
        starts[e] = n;
        for (int b = 0; b < B; b++)
            for (int k = 0; k < K; k++)
                if (choice[(int64_t)b * K + k] == e) rows[n] = b, rw[n++] = cw[(int64_t)b * K + k];
        if (n > starts[e]) used[n_used++] = e;
    }
    starts[E] = n;
    for (int i = 0; i < n; i++) {
        memcpy(gx8 + (int64_t)i * hp, x8 + (int64_t)rows[i] * hp, hp);
        memcpy(gpad + (int64_t)i * hp, xf + (int64_t)rows[i] * hp, hp * sizeof(float));
        memcpy(gdx + (int64_t)i * nbh, dx + (int64_t)rows[i] * nbh, nbh * sizeof(float));
        memcpy(gbs + (int64_t)i * nbh, bs + (int64_t)rows[i] * nbh, nbh * sizeof(float));
    }
    for (int u = 0; u < n_used; u++) {
        int e = used[u], a = starts[e];
        if (M->reads) M->reads[e]++;
        jobs[u] = (GemmJob){M->experts + 2 * e, gx8 + (int64_t)a * hp, gdx + (int64_t)a * nbh,
                            gbs + (int64_t)a * nbh, gpad + (int64_t)a * hp, starts[e + 1] - a,
                            gu + (int64_t)a * 2 * I};
    }
    if (gemm_jobs(jobs, n_used)) return -1;
    llmp_act_mul_quant(gu, n, I, ip, act, apad, ax8, adx, abs_);
    for (int u = 0; u < n_used; u++) {
        int e = used[u], a = starts[e];
        jobs[u] = (GemmJob){M->experts + 2 * e + 1, ax8 + (int64_t)a * ip, adx + (int64_t)a * (ip / 32),
                            abs_ + (int64_t)a * (ip / 32), apad + (int64_t)a * ip,
                            starts[e + 1] - a, y + (int64_t)a * hidden};
    }
    if (gemm_jobs(jobs, n_used)) return -1;
    memset(out, 0, (size_t)B * hidden * sizeof(float));
    for (int i = 0; i < n; i++) { /* weighted, then added: no fused multiply-add, as torch */
        float *o = out + (int64_t)rows[i] * hidden, *yr = y + (int64_t)i * hidden;
        for (int d = 0; d < hidden; d++) yr[d] *= rw[i];
        for (int d = 0; d < hidden; d++) o[d] += yr[d];
    }
    if (S == 0) return 0;
    /* the shared expert, every row: gate * shared(x), rounded, then added (as torch); no
     * gate (glm4_moe's shared experts): added as it is */
    float *gate = logits; /* routing is done: its B * E floats are free */
    if (M->shared_gate) llmp_sigmoid_gate(xf, B, hp, M->shared_gate, hidden, gate);
    memcpy(gx8, x8, (size_t)B * hp); /* qlin may requantize its input in place */
    memcpy(gpad, xf, (size_t)B * hp * sizeof(float));
    memcpy(gdx, dx, (size_t)B * nbh * sizeof(float));
    memcpy(gbs, bs, (size_t)B * nbh * sizeof(float));
    if (qlin(M->shared, gx8, gdx, gbs, B, gu, gpad, hp)) return -1;
    llmp_act_mul_quant(gu, B, S, sp, act, apad, ax8, adx, abs_);
    if (qlin(M->shared + 1, ax8, adx, abs_, B, y, apad, sp)) return -1;
    if (M->shared_gate)
        for (int64_t i = 0; i < (int64_t)B * hidden; i++) y[i] *= gate[i / hidden];
    if (M->shared_scale != 1.f) /* cohere2_moe's average: halved, as the per-op path */
        for (int64_t i = 0; i < (int64_t)B * hidden; i++) y[i] *= M->shared_scale;
    for (int64_t i = 0; i < (int64_t)B * hidden; i++) out[i] += y[i];
    return 0;
}
