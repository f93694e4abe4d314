/* CPU objective in one precision; included by objective.c with OBJ_T, OBJ_FN(n) (the math of
 * objective_math.h for that type) and OBJ_CPU(n) (names of this file's functions) defined.
 * No include guard: included once per type; the parameters are undefined at the end. */

typedef struct {
    const ptl_obj_args *a;
    const ptl_obj_targets *tg;
    int nlev, lw[PTL_OBJ_NUM_LEVELS], lh[PTL_OBJ_NUM_LEVELS];
    int64_t loff[PTL_OBJ_NUM_LEVELS + 1];
} OBJ_CPU(geom);

static void OBJ_CPU(anchor)(const OBJ_CPU(geom) *g, int64_t a, OBJ_T *ax, OBJ_T *ay, OBJ_T *s)
{
    int l = 0;
    while (a >= g->loff[l + 1])
        l++;
    int64_t r = a - g->loff[l];
    *ax = (OBJ_T)(r % g->lw[l]) + (OBJ_T)0.5;
    *ay = (OBJ_T)(r / g->lw[l]) + (OBJ_T)0.5;
    *s = (OBJ_T)(8 << l);
}

static const OBJ_T *OBJ_CPU(gt_box)(const ptl_obj_targets *tg, int b, int j)
{
#if OBJ_IS_DOUBLE
    return tg->box_d + ((int64_t)b * tg->M + j) * 4;
#else
    return tg->box_f + ((int64_t)b * tg->M + j) * 4;
#endif
}

/* overlaps[j, a] and align[j, a] of spec §3.2 (both 0 when a is not a candidate of j). */
static OBJ_T OBJ_CPU(pair)(const OBJ_CPU(geom) *g, const OBJ_T *boxes, const OBJ_T *scores, int b, int j,
                           int64_t a, OBJ_T *align)
{
    const ptl_obj_targets *tg = g->tg;
    const OBJ_T *gb = OBJ_CPU(gt_box)(tg, b, j);
    OBJ_T e[4], ax, ay, s;
    OBJ_FN(stal_box)(gb, e);
    OBJ_CPU(anchor)(g, a, &ax, &ay, &s);
    int64_t ba = (int64_t)b * g->a->A + a;
    return OBJ_FN(pair)(gb, e, ax, ay, s, boxes + ba * 4, scores[ba * g->a->nc + tg->cls[(int64_t)b * tg->M + j]],
                        align);
}

/* A top-k list ordered by value descending, then anchor ascending; only values > 0 enter. */
typedef struct {
    int n;
    int64_t idx[PTL_OBJ_TOPK_O2M];
    OBJ_T val[PTL_OBJ_TOPK_O2M], ovl[PTL_OBJ_TOPK_O2M];
} OBJ_CPU(topk);

/* Anchors arrive in ascending order, so an equal value goes after the ones already held. */
static void OBJ_CPU(topk_push)(OBJ_CPU(topk) *t, int k, int64_t a, OBJ_T v, OBJ_T o)
{
    if (!(v > 0) || (t->n == k && !(v > t->val[k - 1])))
        return;
    int i = t->n < k ? t->n++ : k - 1;
    while (i > 0 && v > t->val[i - 1]) {
        t->idx[i] = t->idx[i - 1];
        t->val[i] = t->val[i - 1];
        t->ovl[i] = t->ovl[i - 1];
        i--;
    }
    t->idx[i] = a;
    t->val[i] = v;
    t->ovl[i] = o;
}

static int OBJ_CPU(topk_has)(const OBJ_CPU(topk) *t, int64_t a)
{
    for (int i = 0; i < t->n; i++)
        if (t->idx[i] == a)
            return 1;
    return 0;
}

typedef struct {
    int32_t *claim;  /* [A] number of GTs whose top-k holds the anchor, -1 once a conflict is resolved */
    int64_t *sel;    /* [n*topk] selected anchors per GT, -1 padded */
    int64_t *bucket; /* [A] positives grouped by GT */
    int64_t *bstart; /* [n+1] */
    OBJ_T *palign, *povl; /* [A] metric and overlap of the anchor's GT */
    OBJ_T *amax, *omax;   /* [n] */
} OBJ_CPU(scratch);

/* Assignment of image b for one branch: owner[a] (GT index or -1) and nval[a] (normalised target). */
static void OBJ_CPU(assign_image)(const OBJ_CPU(geom) *g, const OBJ_T *boxes, const OBJ_T *scores, int b,
                                  int topk, int topk2, OBJ_CPU(scratch) *w, int32_t *owner, OBJ_T *nval)
{
    const ptl_obj_targets *tg = g->tg;
    int64_t A = g->a->A;
    int n = tg->count[b];
    for (int64_t a = 0; a < A; a++) {
        owner[a] = -1;
        nval[a] = 0;
        w->claim[a] = 0;
    }
    if (n == 0)
        return;

    /* steps 1-3: candidates, metric, top-k per GT */
    for (int j = 0; j < n; j++) {
        const OBJ_T *gb = OBJ_CPU(gt_box)(tg, b, j);
        OBJ_T e[4];
        OBJ_FN(stal_box)(gb, e);
        OBJ_CPU(topk) t;
        t.n = 0;
        for (int l = 0; l < g->nlev; l++) {
            OBJ_T s = (OBJ_T)(8 << l);
            int x0, x1, y0, y1;
            OBJ_FN(cell_range)(e[0], e[2], s, g->lw[l], &x0, &x1);
            OBJ_FN(cell_range)(e[1], e[3], s, g->lh[l], &y0, &y1);
            for (int y = y0; y < y1; y++)
                for (int x = x0; x < x1; x++) {
                    int64_t a = g->loff[l] + (int64_t)y * g->lw[l] + x;
                    OBJ_T al;
                    OBJ_T u = OBJ_CPU(pair)(g, boxes, scores, b, j, a, &al);
                    OBJ_CPU(topk_push)(&t, topk, a, al, u);
                }
        }
        int64_t *sel = w->sel + (int64_t)j * topk;
        int ns = 0;
        for (int i = 0; i < t.n; i++) {
            sel[ns++] = t.idx[i];
            int64_t a = t.idx[i];
            w->claim[a]++;
            owner[a] = j;
            w->palign[a] = t.val[i];
            w->povl[a] = t.ovl[i];
        }
        /* fewer than topk non-zero metrics: the remaining picks are the lowest-index zero-metric
         * anchors; they stay positive only where they are candidates */
        int r = topk - t.n;
        for (int64_t a = 0; a < A && r > 0; a++) {
            if (OBJ_CPU(topk_has)(&t, a))
                continue;
            r--;
            OBJ_T al;
            OBJ_T u = OBJ_CPU(pair)(g, boxes, scores, b, j, a, &al);
            OBJ_T ax, ay, s;
            OBJ_CPU(anchor)(g, a, &ax, &ay, &s);
            if (!OBJ_FN(inside)(e, OBJ_MUL(ax, s), OBJ_MUL(ay, s)))
                continue;
            sel[ns++] = a;
            w->claim[a]++;
            owner[a] = j;
            w->palign[a] = al;
            w->povl[a] = u;
        }
        for (; ns < topk; ns++)
            sel[ns] = -1;
    }

    /* step 4: an anchor claimed by several GTs goes to the largest overlap over all GTs */
    for (int64_t i = 0; i < (int64_t)n * topk; i++) {
        int64_t a = w->sel[i];
        if (a < 0 || w->claim[a] <= 1)
            continue;
        w->claim[a] = -1;
        int best = 0;
        OBJ_T bal, bov = OBJ_CPU(pair)(g, boxes, scores, b, 0, a, &bal);
        for (int j = 1; j < n; j++) {
            OBJ_T al, ov = OBJ_CPU(pair)(g, boxes, scores, b, j, a, &al);
            if (ov > bov) {
                bov = ov;
                bal = al;
                best = j;
            }
        }
        owner[a] = best;
        w->palign[a] = bal;
        w->povl[a] = bov;
    }

    /* positives grouped by GT, ascending anchors */
    for (int j = 0; j <= n; j++)
        w->bstart[j] = 0;
    for (int64_t a = 0; a < A; a++)
        if (owner[a] >= 0)
            w->bstart[owner[a] + 1]++;
    for (int j = 0; j < n; j++)
        w->bstart[j + 1] += w->bstart[j];
    {
        int64_t *fill = w->sel; /* reused as per-GT write cursors */
        for (int j = 0; j < n; j++)
            fill[j] = w->bstart[j];
        for (int64_t a = 0; a < A; a++)
            if (owner[a] >= 0)
                w->bucket[fill[owner[a]]++] = a;
    }

    /* step 5: keep each GT's topk2 best positives by metric (same ordering over all anchors) */
    if (topk2 != topk) {
        for (int j = 0; j < n; j++) {
            OBJ_CPU(topk) t;
            t.n = 0;
            for (int64_t p = w->bstart[j]; p < w->bstart[j + 1]; p++) {
                int64_t a = w->bucket[p];
                OBJ_CPU(topk_push)(&t, topk2, a, w->palign[a], w->povl[a]);
            }
            int64_t zero_keep[PTL_OBJ_TOPK_O2M];
            int nz = 0, r = topk2 - t.n;
            for (int64_t a = 0; a < A && r > 0; a++) {
                if (OBJ_CPU(topk_has)(&t, a))
                    continue;
                r--;
                if (owner[a] == j)
                    zero_keep[nz++] = a;
            }
            for (int64_t p = w->bstart[j]; p < w->bstart[j + 1]; p++) {
                int64_t a = w->bucket[p];
                int keep = OBJ_CPU(topk_has)(&t, a);
                for (int q = 0; q < nz && !keep; q++)
                    keep = zero_keep[q] == a;
                if (!keep)
                    owner[a] = -1;
            }
        }
    }

    /* step 7: normalised target scores */
    for (int j = 0; j < n; j++)
        w->amax[j] = w->omax[j] = 0;
    for (int64_t a = 0; a < A; a++) {
        int j = owner[a];
        if (j < 0)
            continue;
        if (w->palign[a] > w->amax[j])
            w->amax[j] = w->palign[a];
        if (w->povl[a] > w->omax[j])
            w->omax[j] = w->povl[a];
    }
    for (int64_t a = 0; a < A; a++) {
        int j = owner[a];
        if (j >= 0)
            nval[a] = OBJ_DIV(OBJ_MUL(w->palign[a], w->omax[j]), OBJ_ADD(w->amax[j], (OBJ_T)1e-9));
    }
}

/* Loss sums of one image (box, cls, l1; not yet divided by T) and, when gscale is given, the
 * gradients: gscale = (box, cls, l1) multipliers of d(sum)/d(output), i.e. weight * B * gain / T. */
static void OBJ_CPU(loss_image)(const OBJ_CPU(geom) *g, const OBJ_T *boxes, const OBJ_T *scores, int b,
                                const int32_t *owner, const OBJ_T *nval, const double *gscale, OBJ_T *gbox,
                                OBJ_T *gsc, double *sums)
{
    const ptl_obj_args *ar = g->a;
    const ptl_obj_targets *tg = g->tg;
    int64_t A = ar->A;
    int nc = ar->nc;
    double sb = 0, sc = 0, sl = 0;
    OBJ_T kb = 0, kc = 0, kl = 0;
    if (gscale) {
        kb = (OBJ_T)gscale[0];
        kc = (OBJ_T)gscale[1];
        kl = (OBJ_T)gscale[2];
    }
    for (int64_t a = 0; a < A; a++) {
        int64_t ba = (int64_t)b * A + a;
        int j = owner[ba];
        OBJ_T t = j >= 0 ? nval[ba] : 0;
        int tc = j >= 0 ? tg->cls[(int64_t)b * tg->M + j] : -1;
        const OBJ_T *x = scores + ba * nc;
        for (int c = 0; c < nc; c++) {
            OBJ_T tt = c == tc ? t : 0;
            sc += (double)OBJ_FN(bce)(x[c], tt);
            if (gsc)
                gsc[ba * nc + c] = (OBJ_FN(sigmoid)(x[c]) - tt) * kc;
        }
        OBJ_T gd[4] = {0, 0, 0, 0};
        if (j >= 0 && t != 0) {
            OBJ_T ax, ay, s;
            OBJ_CPU(anchor)(g, a, &ax, &ay, &s);
            const OBJ_T *gb = OBJ_CPU(gt_box)(tg, b, j);
            OBJ_T tx1 = gb[0] / s, ty1 = gb[1] / s, tx2 = gb[2] / s, ty2 = gb[3] / s;
            const OBJ_T *d = boxes + ba * 4;
            OBJ_T cg[4];
            OBJ_T ci = OBJ_FN(ciou_grad)(ax - d[0], ay - d[1], ax + d[2], ay + d[3], tx1, ty1, tx2, ty2, cg);
            sb += (double)((1 - ci) * t);
            /* target and predicted ltrb, stride-scaled and image-normalised (l, r by W; t, b by H) */
            OBJ_T tn[4] = {((ax - tx1) * s) / (OBJ_T)ar->W, ((ay - ty1) * s) / (OBJ_T)ar->H,
                           ((tx2 - ax) * s) / (OBJ_T)ar->W, ((ty2 - ay) * s) / (OBJ_T)ar->H};
            OBJ_T norm[4] = {(OBJ_T)ar->W, (OBJ_T)ar->H, (OBJ_T)ar->W, (OBJ_T)ar->H};
            OBJ_T l1 = 0;
            for (int k = 0; k < 4; k++) {
                OBJ_T diff = (d[k] * s) / norm[k] - tn[k];
                l1 += diff < 0 ? -diff : diff;
                OBJ_T sg = diff > 0 ? (OBJ_T)1 : (diff < 0 ? (OBJ_T)-1 : (OBJ_T)0);
                gd[k] = kl * t * sg / 4 * s / norm[k];
            }
            sl += (double)(l1 / 4 * t);
            /* x1 = ax - l, y1 = ay - t, x2 = ax + r, y2 = ay + b; d(1 - ciou) = -dciou */
            OBJ_T kt = OBJ_MUL(kb, t);
            gd[0] = OBJ_ADD(gd[0], OBJ_MUL(kt, cg[0]));
            gd[1] = OBJ_ADD(gd[1], OBJ_MUL(kt, cg[1]));
            gd[2] = OBJ_SUB(gd[2], OBJ_MUL(kt, cg[2]));
            gd[3] = OBJ_SUB(gd[3], OBJ_MUL(kt, cg[3]));
        }
        if (gbox)
            for (int k = 0; k < 4; k++)
                gbox[ba * 4 + k] = gd[k];
    }
    sums[0] = sb;
    sums[1] = sc;
    sums[2] = sl;
}

static int OBJ_CPU(run)(const ptl_obj_args *ar, const ptl_obj_targets *tg)
{
    OBJ_CPU(geom) g;
    int B = ar->B;
    int64_t A = ar->A;
    int32_t *owner = NULL;
    OBJ_T *nval = NULL;
    double *sums = NULL;
    int nthreads = 1;
    OBJ_CPU(scratch) *scr = NULL;
    int rc = -1;
    double w[2] = {ar->o2m_weight, ar->o2m_weight < 1 ? 1 - ar->o2m_weight : 0};
    const int topks[2] = {PTL_OBJ_TOPK_O2M, PTL_OBJ_TOPK_O2O}, topk2s[2] = {PTL_OBJ_TOPK2_O2M, PTL_OBJ_TOPK2_O2O};
    double comp[2][3];

    g.a = ar;
    g.tg = tg;
    g.nlev = PTL_OBJ_NUM_LEVELS;
    g.loff[0] = 0;
    for (int l = 0; l < g.nlev; l++) {
        g.lw[l] = ar->W / (8 << l);
        g.lh[l] = ar->H / (8 << l);
        g.loff[l + 1] = g.loff[l] + (int64_t)g.lw[l] * g.lh[l];
    }
#ifdef _OPENMP
    nthreads = omp_get_max_threads();
#endif
    owner = (int32_t *)malloc(sizeof(int32_t) * (size_t)(B * A) + 1);
    nval = (OBJ_T *)malloc(sizeof(OBJ_T) * (size_t)(B * A) + 1);
    sums = (double *)calloc((size_t)B * 3 + 1, sizeof(double));
    scr = (OBJ_CPU(scratch) *)calloc((size_t)nthreads, sizeof(*scr));
    if (!owner || !nval || !sums || !scr) {
        ptl_set_error(PTL_ERR_MEMORY, "objective: out of host memory");
        goto fail;
    }
    for (int t = 0; t < nthreads; t++) {
        int64_t n = tg->M + 1;
        scr[t].claim = (int32_t *)malloc(sizeof(int32_t) * (size_t)A);
        scr[t].sel = (int64_t *)malloc(sizeof(int64_t) * (size_t)(n * PTL_OBJ_TOPK_O2M));
        scr[t].bucket = (int64_t *)malloc(sizeof(int64_t) * (size_t)A);
        scr[t].bstart = (int64_t *)malloc(sizeof(int64_t) * (size_t)(n + 1));
        scr[t].palign = (OBJ_T *)malloc(sizeof(OBJ_T) * (size_t)A);
        scr[t].povl = (OBJ_T *)malloc(sizeof(OBJ_T) * (size_t)A);
        scr[t].amax = (OBJ_T *)malloc(sizeof(OBJ_T) * (size_t)n);
        scr[t].omax = (OBJ_T *)malloc(sizeof(OBJ_T) * (size_t)n);
        if (!scr[t].claim || !scr[t].sel || !scr[t].bucket || !scr[t].bstart || !scr[t].palign || !scr[t].povl ||
            !scr[t].amax || !scr[t].omax) {
            ptl_set_error(PTL_ERR_MEMORY, "objective: out of host memory");
            goto fail;
        }
    }

    for (int br = 0; br < 2; br++) {
        const OBJ_T *boxes = (const OBJ_T *)ar->boxes[br], *scores = (const OBJ_T *)ar->scores[br];
        if (ar->assign_in) {
            PTL_CHECK(ptl_obj_check_assignment(ar->assign_gt[br], B, A, tg, br ? "assign_gt[1]" : "assign_gt[0]"));
            memcpy(owner, ar->assign_gt[br], sizeof(int32_t) * (size_t)(B * A));
            memcpy(nval, ar->assign_score[br], sizeof(OBJ_T) * (size_t)(B * A));
        } else {
#pragma omp parallel for schedule(dynamic, 1)
            for (int b = 0; b < B; b++) {
                int t = 0;
#ifdef _OPENMP
                t = omp_get_thread_num();
#endif
                OBJ_CPU(assign_image)(&g, boxes, scores, b, topks[br], topk2s[br], &scr[t], owner + (int64_t)b * A,
                                      nval + (int64_t)b * A);
            }
            if (ar->assign_gt[br])
                memcpy(ar->assign_gt[br], owner, sizeof(int32_t) * (size_t)(B * A));
            if (ar->assign_score[br])
                memcpy(ar->assign_score[br], nval, sizeof(OBJ_T) * (size_t)(B * A));
        }
        /* T = max(sum of target scores, 1) over the batch, summed in a fixed order */
        double tsum = 0;
        for (int64_t i = 0; i < B * A; i++)
            if (owner[i] >= 0)
                tsum += (double)nval[i];
        double T = tsum > 1 ? tsum : 1;
        /* same order of operations as the CUDA kernels: (w * B * scale * gain) / T */
        const double wbs = w[br] * B * ar->grad_scale;
        double gs[3] = {wbs * ar->gain[0] / T, wbs * ar->gain[1] / T, wbs * ar->gain[2] / T};
        OBJ_T *gbox = (OBJ_T *)ar->grad_boxes[br], *gsc = (OBJ_T *)ar->grad_scores[br];
#pragma omp parallel for schedule(dynamic, 1)
        for (int b = 0; b < B; b++)
            OBJ_CPU(loss_image)(&g, boxes, scores, b, owner, nval, gs, gbox, gsc, sums + 3 * b);
        double s3[3] = {0, 0, 0};
        for (int b = 0; b < B; b++)
            for (int k = 0; k < 3; k++)
                s3[k] += sums[3 * b + k];
        for (int k = 0; k < 3; k++)
            comp[br][k] = ar->gain[k] * s3[k] / T;
    }
    {
        double total = 0;
        for (int br = 0; br < 2; br++)
            for (int k = 0; k < 3; k++) {
                ar->losses[1 + 3 * br + k] = (float)(B * comp[br][k]);
                total += w[br] * B * comp[br][k];
            }
        ar->losses[0] = (float)total;
        for (int k = 0; k < 3; k++)
            ar->losses[7 + k] = (float)comp[1][k];
    }
    rc = 0;
fail:
    if (scr)
        for (int t = 0; t < nthreads; t++) {
            free(scr[t].claim);
            free(scr[t].sel);
            free(scr[t].bucket);
            free(scr[t].bstart);
            free(scr[t].palign);
            free(scr[t].povl);
            free(scr[t].amax);
            free(scr[t].omax);
        }
    free(scr);
    free(owner);
    free(nval);
    free(sums);
    return rc;
}

#undef OBJ_IS_DOUBLE
#undef OBJ_T
#undef OBJ_FN
#undef OBJ_CPU
#undef OBJ_MUL
#undef OBJ_ADD
#undef OBJ_DIV
#undef OBJ_SUB
