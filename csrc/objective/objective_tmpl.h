/* Objective math in one precision: included by objective_math.h once per type with
 *   OBJ_T        the compute type (float or double)
 *   OBJ_FN(n)    the name of function n for that type
 *   OBJ_MUL/ADD/SUB/DIV, OBJ_SQRT, OBJ_EXP, OBJ_ATAN, OBJ_LOG1P   its arithmetic.
 * The float32 instance is shared by the CPU and the CUDA backend and written through the explicitly
 * rounded PTL_F* operations, so both compute the assigner's decisions from the same IEEE operations in
 * the same order as torchref's expressions (only exp and atan may differ by an ulp between libm and
 * CUDA). No include guard: this file is meant to be included more than once; it undefines its
 * parameters at the end, so each instance starts clean. */

/* Complete IoU of box a and box b (xyxy) as 8.4.190's bbox_iou(CIoU=True), in its operation order. */
PTL_HD OBJ_T OBJ_FN(ciou)(OBJ_T ax1, OBJ_T ay1, OBJ_T ax2, OBJ_T ay2, OBJ_T bx1, OBJ_T by1, OBJ_T bx2, OBJ_T by2)
{
    const OBJ_T eps = (OBJ_T)1e-7;
    OBJ_T w1 = OBJ_SUB(ax2, ax1), h1 = OBJ_ADD(OBJ_SUB(ay2, ay1), eps);
    OBJ_T w2 = OBJ_SUB(bx2, bx1), h2 = OBJ_ADD(OBJ_SUB(by2, by1), eps);
    OBJ_T iw = OBJ_SUB(OBJ_MIN(ax2, bx2), OBJ_MAX(ax1, bx1));
    OBJ_T ih = OBJ_SUB(OBJ_MIN(ay2, by2), OBJ_MAX(ay1, by1));
    OBJ_T inter = OBJ_MUL(OBJ_MAX(iw, (OBJ_T)0), OBJ_MAX(ih, (OBJ_T)0));
    OBJ_T uni = OBJ_ADD(OBJ_SUB(OBJ_ADD(OBJ_MUL(w1, h1), OBJ_MUL(w2, h2)), inter), eps);
    OBJ_T iou = OBJ_DIV(inter, uni);
    OBJ_T cw = OBJ_SUB(OBJ_MAX(ax2, bx2), OBJ_MIN(ax1, bx1));
    OBJ_T ch = OBJ_SUB(OBJ_MAX(ay2, by2), OBJ_MIN(ay1, by1));
    OBJ_T c2 = OBJ_ADD(OBJ_ADD(OBJ_MUL(cw, cw), OBJ_MUL(ch, ch)), eps);
    OBJ_T dx = OBJ_SUB(OBJ_SUB(OBJ_ADD(bx1, bx2), ax1), ax2);
    OBJ_T dy = OBJ_SUB(OBJ_SUB(OBJ_ADD(by1, by2), ay1), ay2);
    OBJ_T rho2 = OBJ_DIV(OBJ_ADD(OBJ_MUL(dx, dx), OBJ_MUL(dy, dy)), (OBJ_T)4);
    OBJ_T da = OBJ_SUB(OBJ_ATAN(OBJ_DIV(w2, h2)), OBJ_ATAN(OBJ_DIV(w1, h1)));
    OBJ_T v = OBJ_MUL((OBJ_T)PTL_OBJ_4_PI2, OBJ_MUL(da, da));
    OBJ_T alpha = OBJ_DIV(v, OBJ_ADD(OBJ_ADD(OBJ_SUB((OBJ_T)1, iou), v), eps));
    return OBJ_SUB(iou, OBJ_ADD(OBJ_DIV(rho2, c2), OBJ_MUL(v, alpha)));
}

/* d CIoU / d (ax1, ay1, ax2, ay2) with alpha held constant (torch.no_grad in bbox_iou); returns CIoU. Ties of min/max
 * split the gradient in halves and clamp(min=0) passes it at exactly 0 (torch's autograd conventions).
 * Written with the explicit operations too, so both backends give the same bits. */
PTL_HD OBJ_T OBJ_FN(ciou_grad)(OBJ_T ax1, OBJ_T ay1, OBJ_T ax2, OBJ_T ay2, OBJ_T bx1, OBJ_T by1, OBJ_T bx2,
                               OBJ_T by2, OBJ_T *g)
{
#define M_(a, b) OBJ_MUL(a, b)
#define A_(a, b) OBJ_ADD(a, b)
#define S_(a, b) OBJ_SUB(a, b)
#define D_(a, b) OBJ_DIV(a, b)
#define SEL_(c, t) ((c) ? (OBJ_T)1 : ((t) ? (OBJ_T)0.5 : (OBJ_T)0))
    const OBJ_T eps = (OBJ_T)1e-7, two = (OBJ_T)2;
    OBJ_T w1 = S_(ax2, ax1), h1 = A_(S_(ay2, ay1), eps);
    OBJ_T w2 = S_(bx2, bx1), h2 = A_(S_(by2, by1), eps);
    OBJ_T iw = S_(OBJ_MIN(ax2, bx2), OBJ_MAX(ax1, bx1));
    OBJ_T ih = S_(OBJ_MIN(ay2, by2), OBJ_MAX(ay1, by1));
    OBJ_T iwc = OBJ_MAX(iw, (OBJ_T)0), ihc = OBJ_MAX(ih, (OBJ_T)0);
    OBJ_T inter = M_(iwc, ihc);
    OBJ_T uni = A_(S_(A_(M_(w1, h1), M_(w2, h2)), inter), eps);
    OBJ_T iou = D_(inter, uni);
    OBJ_T cw = S_(OBJ_MAX(ax2, bx2), OBJ_MIN(ax1, bx1));
    OBJ_T ch = S_(OBJ_MAX(ay2, by2), OBJ_MIN(ay1, by1));
    OBJ_T c2 = A_(A_(M_(cw, cw), M_(ch, ch)), eps);
    OBJ_T dx = S_(S_(A_(bx1, bx2), ax1), ax2);
    OBJ_T dy = S_(S_(A_(by1, by2), ay1), ay2);
    OBJ_T rho2 = D_(A_(M_(dx, dx), M_(dy, dy)), (OBJ_T)4);
    OBJ_T z1 = D_(w1, h1);
    OBJ_T da = S_(OBJ_ATAN(D_(w2, h2)), OBJ_ATAN(z1));
    OBJ_T k = (OBJ_T)PTL_OBJ_4_PI2;
    OBJ_T v = M_(k, M_(da, da));
    OBJ_T alpha = D_(v, A_(A_(S_((OBJ_T)1, iou), v), eps));
    OBJ_T out = S_(iou, A_(D_(rho2, c2), M_(v, alpha)));

    /* selector derivatives: d min(a2, b2) / d a2 etc. */
    OBJ_T s_iw = SEL_(iw >= 0, 0), s_ih = SEL_(ih >= 0, 0);
    OBJ_T sx1 = M_(s_iw, SEL_(ax1 > bx1, ax1 == bx1)), sx2 = M_(s_iw, SEL_(ax2 < bx2, ax2 == bx2));
    OBJ_T sy1 = M_(s_ih, SEL_(ay1 > by1, ay1 == by1)), sy2 = M_(s_ih, SEL_(ay2 < by2, ay2 == by2));
    OBJ_T cx1 = SEL_(ax1 < bx1, ax1 == bx1), cx2 = SEL_(ax2 > bx2, ax2 == bx2);
    OBJ_T cy1 = SEL_(ay1 < by1, ay1 == by1), cy2 = SEL_(ay2 > by2, ay2 == by2);
    /* d inter, d union = d(w1 h1) - d inter, d iou = (d inter * union - inter * d union) / union^2 */
    OBJ_T di[4] = {-M_(ihc, sx1), -M_(iwc, sy1), M_(ihc, sx2), M_(iwc, sy2)};
    OBJ_T dwh[4] = {-h1, -w1, h1, w1};
    OBJ_T u2 = M_(uni, uni);
    /* rho2 / c2: d rho2 / d ax1 = d / d ax2 = -dx / 2; d c2 = 2 cw d cw + 2 ch d ch */
    OBJ_T dr[4] = {D_(-dx, two), D_(-dy, two), D_(-dx, two), D_(-dy, two)};
    OBJ_T dc[4] = {-M_(M_(two, cw), cx1), -M_(M_(two, ch), cy1), M_(M_(two, cw), cx2), M_(M_(two, ch), cy2)};
    OBJ_T cc = M_(c2, c2);
    /* v: d atan(z1) / d z1 = 1 / (1 + z1^2), z1 = w1 / h1 */
    OBJ_T dvz = D_(M_(M_(-two, k), da), A_((OBJ_T)1, M_(z1, z1)));
    OBJ_T dvw = D_(dvz, h1), dvh = D_(M_(-dvz, w1), M_(h1, h1));
    OBJ_T dv[4] = {-dvw, -dvh, dvw, dvh};
    for (int q = 0; q < 4; q++) {
        OBJ_T du = S_(dwh[q], di[q]);
        OBJ_T diou = D_(S_(M_(di[q], uni), M_(inter, du)), u2);
        OBJ_T dt = D_(S_(M_(dr[q], c2), M_(rho2, dc[q])), cc);
        g[q] = S_(S_(diou, dt), M_(alpha, dv[q]));
    }
    return out;
#undef M_
#undef A_
#undef S_
#undef D_
#undef SEL_
}

PTL_HD OBJ_T OBJ_FN(sigmoid)(OBJ_T x) { return OBJ_DIV((OBJ_T)1, OBJ_ADD((OBJ_T)1, OBJ_EXP(-x))); }

/* Task-aligned metric s^0.5 * u^6 of §3.2 (u already clamped at 0); u^6 as (u^2)^3 by products. */
PTL_HD OBJ_T OBJ_FN(align)(OBJ_T s, OBJ_T u)
{
    OBJ_T u2 = OBJ_MUL(u, u);
    return OBJ_MUL(OBJ_SQRT(s), OBJ_MUL(OBJ_MUL(u2, u2), u2));
}

/* BCE with logits, the numerically stable form max(x,0) - x*t + log1p(exp(-|x|)). */
PTL_HD OBJ_T OBJ_FN(bce)(OBJ_T x, OBJ_T t)
{
    OBJ_T ax = x < 0 ? -x : x;
    return (x > 0 ? x : (OBJ_T)0) - x * t + OBJ_LOG1P(OBJ_EXP(-ax));
}

/* STAL candidate box (8.4.190's select_candidates_in_gts): xyxy -> centre/size -> sides under
 * PTL_OBJ_STAL_SIDE (the second stride, 16 px) set to it -> xyxy. */
PTL_HD void OBJ_FN(stal_box)(const OBJ_T *b, OBJ_T *e)
{
    OBJ_T cx = OBJ_DIV(OBJ_ADD(b[0], b[2]), (OBJ_T)2), cy = OBJ_DIV(OBJ_ADD(b[1], b[3]), (OBJ_T)2);
    OBJ_T w = OBJ_SUB(b[2], b[0]), h = OBJ_SUB(b[3], b[1]);
    if (w < (OBJ_T)PTL_OBJ_STAL_SIDE)
        w = (OBJ_T)PTL_OBJ_STAL_SIDE;
    if (h < (OBJ_T)PTL_OBJ_STAL_SIDE)
        h = (OBJ_T)PTL_OBJ_STAL_SIDE;
    OBJ_T hw = OBJ_DIV(w, (OBJ_T)2), hh = OBJ_DIV(h, (OBJ_T)2);
    e[0] = OBJ_SUB(cx, hw);
    e[1] = OBJ_SUB(cy, hh);
    e[2] = OBJ_ADD(cx, hw);
    e[3] = OBJ_ADD(cy, hh);
}

/* Anchor at pixel centre (px, py) strictly inside candidate box e (margin 1e-9). */
PTL_HD int OBJ_FN(inside)(const OBJ_T *e, OBJ_T px, OBJ_T py)
{
    const OBJ_T eps = (OBJ_T)1e-9;
    return OBJ_SUB(px, e[0]) > eps && OBJ_SUB(py, e[1]) > eps && OBJ_SUB(e[2], px) > eps && OBJ_SUB(e[3], py) > eps;
}

/* Assigner overlap u = max(CIoU(gt, pred px), 0) of GT box g (pixels) and the decoded prediction of an
 * anchor at grid point (ax, ay) with raw distances d (grid units) and stride s. */
PTL_HD OBJ_T OBJ_FN(overlap)(const OBJ_T *g, OBJ_T ax, OBJ_T ay, OBJ_T s, OBJ_T l, OBJ_T t, OBJ_T r, OBJ_T b)
{
    OBJ_T px1 = OBJ_MUL(OBJ_SUB(ax, l), s), py1 = OBJ_MUL(OBJ_SUB(ay, t), s);
    OBJ_T px2 = OBJ_MUL(OBJ_ADD(ax, r), s), py2 = OBJ_MUL(OBJ_ADD(ay, b), s);
    OBJ_T c = OBJ_FN(ciou)(g[0], g[1], g[2], g[3], px1, py1, px2, py2);
    return c > 0 ? c : (OBJ_T)0;
}

/* overlaps[j, a] and align[j, a] (spec §3.2) of GT box g with candidate box e and an anchor at grid
 * point (ax, ay), stride s, raw distances d, class logit `logit`; both 0 when a is not a candidate. */
PTL_HD OBJ_T OBJ_FN(pair)(const OBJ_T *g, const OBJ_T *e, OBJ_T ax, OBJ_T ay, OBJ_T s, const OBJ_T *d, OBJ_T logit,
                          OBJ_T *align)
{
    *align = 0;
    if (!OBJ_FN(inside)(e, OBJ_MUL(ax, s), OBJ_MUL(ay, s)))
        return 0;
    OBJ_T u = OBJ_FN(overlap)(g, ax, ay, s, d[0], d[1], d[2], d[3]);
    *align = OBJ_FN(align)(OBJ_FN(sigmoid)(logit), u);
    return u;
}

/* Cells [*c0, *c1) of one level along one axis whose centres lie strictly inside [lo, hi] (margin
 * 1e-9), s the stride, n the cells. Both conditions are monotone in the cell index, so the range is
 * contiguous; a guess from the division is corrected with the exact predicate of inside(). */
PTL_HD void OBJ_FN(cell_range)(OBJ_T lo, OBJ_T hi, OBJ_T s, int n, int *c0, int *c1)
{
    const OBJ_T eps = (OBJ_T)1e-9;
#define OBJ_PASS_LO(x) (OBJ_SUB(OBJ_MUL((OBJ_T)(x) + (OBJ_T)0.5, s), lo) > eps)
#define OBJ_PASS_HI(x) (OBJ_SUB(hi, OBJ_MUL((OBJ_T)(x) + (OBJ_T)0.5, s)) > eps)
    double g = floor((double)lo / (double)s - 0.5);
    int x = !(g >= 0) ? 0 : (g > n ? n : (int)g);
    while (x > 0 && OBJ_PASS_LO(x - 1))
        x--;
    while (x < n && !OBJ_PASS_LO(x))
        x++;
    *c0 = x;
    g = ceil((double)hi / (double)s - 0.5);
    int y = !(g >= x) ? x : (g > n ? n : (int)g);
    while (y > x && !OBJ_PASS_HI(y - 1))
        y--;
    while (y < n && OBJ_PASS_HI(y))
        y++;
    *c1 = y;
#undef OBJ_PASS_LO
#undef OBJ_PASS_HI
}

#undef OBJ_T
#undef OBJ_FN
#undef OBJ_MUL
#undef OBJ_ADD
#undef OBJ_SUB
#undef OBJ_DIV
#undef OBJ_SQRT
#undef OBJ_EXP
#undef OBJ_ATAN
#undef OBJ_LOG1P
