/* Plans derived from the network description (net_plan.h): the gradient plan, the weight-cast table
 * and the per-shape memory layout. */
#include "net_plan.h"

#include <stdlib.h>
#include <string.h>

_Static_assert(PTL_NET_MAX_PARTS <= 8, "an op's grad_in and keep_in hold a bit per input");

static int is_conv(const ptl_net_op *op) { return op->kind == PTL_OP_CONV || op->kind == PTL_OP_CONV_BIAS; }

static int oom(void) { return ptl_set_error(PTL_ERR_MEMORY, "network plan: out of host memory"); }

/* ------------------------------------------------------------------------------- gradient plan */

void ptl_net_grad_plan_free(ptl_net_grad_plan *gp)
{
    free(gp->born);
    free(gp->dies);
    free(gp->first);
    free(gp->zero_op);
    free(gp->zero_list);
    free(gp->zero_begin);
    memset(gp, 0, sizeof *gp);
}

/* The backward replayed once on the op list: for every value the first and last backward step that
 * touch its gradient, for every write whether it is the first (then it overwrites), and which slots
 * must be zeroed because their first write covers only some channels or nothing writes them before
 * they are read. */
int ptl_net_grad_plan_build(const ptl_network *net, ptl_net_grad_plan *gp)
{
    const int nv = net->nvalues, nops = net->nops;
    memset(gp, 0, sizeof *gp);
    gp->nvalues = nv;
    gp->nops = nops;
    char *touched = calloc((size_t)nv, 1);
    gp->born = malloc((size_t)nv * sizeof(int));
    gp->dies = malloc((size_t)nv * sizeof(int));
    gp->zero_op = malloc((size_t)nv * sizeof(int));
    gp->first = calloc((size_t)nops, sizeof(uint32_t));
    gp->zero_list = malloc((size_t)(nv ? nv : 1) * sizeof(int));
    gp->zero_begin = malloc((size_t)(nops + 1) * sizeof(int));
    if (!touched || !gp->born || !gp->dies || !gp->zero_op || !gp->first || !gp->zero_list || !gp->zero_begin) {
        free(touched);
        ptl_net_grad_plan_free(gp);
        return oom();
    }
    for (int v = 0; v < nv; v++)
        gp->born[v] = gp->dies[v] = gp->zero_op[v] = -1;
    gp->dies[net->input] = nops; /* the image gradient is read after the last step */
    for (int t = 0; t < nops; t++) {
        const int i = nops - 1 - t;
        const ptl_net_op *op = &net->ops[i];
        /* reads: the op's own outputs (and its inner value z, written and read within this step) */
        const int outs[3] = {op->out, op->z, op->out2};
        for (int j = 0; j < 3; j++) {
            const int v = outs[j];
            if (v < 0)
                continue;
            if (j == 1) { /* z: written by the op's own backward in this very step */
                gp->born[v] = t;
                touched[v] = 1;
            } else if (!touched[v]) { /* read but never written: must read as zero */
                gp->born[v] = t;
                gp->zero_op[v] = i;
                touched[v] = 1;
            }
            gp->dies[v] = t;
        }
        /* writes: the first write of a gradient overwrites; one of only some channels finds its slot zeroed */
        for (int j = 0; j < op->nin; j++) {
            const ptl_net_part *in = &op->ins[j];
            if (!(op->grad_in >> j & 1u) || touched[in->value])
                continue;
            touched[in->value] = 1;
            gp->born[in->value] = t;
            gp->first[i] |= 1u << j;
            if (in->c0 != 0 || in->nc != net->values[in->value].C)
                gp->zero_op[in->value] = i;
        }
    }
    free(touched);
    int k = 0;
    for (int i = 0; i < nops; i++) {
        gp->zero_begin[i] = k;
        for (int v = 0; v < nv; v++)
            if (gp->zero_op[v] == i)
                gp->zero_list[k++] = v;
    }
    gp->zero_begin[nops] = k;
    return 0;
}

/* ----------------------------------------------------------------------------- Concat in place */

/* Whether Concat op k's part j (of value P, whole, at channel `at` of its output) can be built in place. */
static int part_in_place(const ptl_network *net, const uint8_t *slices, const ptl_net_op *ops, const int *producer,
                         int k, int j)
{
    const ptl_net_part *part = &ops[k].ins[j];
    const int P = part->value, p = producer[P];
    if (P == net->input || P == ops[k].out || p < 0 || p > k || part->c0 || part->nc != net->values[P].C ||
        !(slices[ops[p].kind] & PTL_NET_SLICE_OUT))
        return 0;
    for (int r = 0; r < net->nops; r++)
        for (int q = 0; q < ops[r].nin; q++) {
            if (ops[r].ins[q].value != P || (r == k && q == j))
                continue;
            if (r == k || !(slices[ops[r].kind] & PTL_NET_SLICE_IN) || (ops[r].grad_in >> q & 1u && r > k))
                return 0;
        }
    return 1;
}

int ptl_net_cat_in_place(const ptl_network *net, const uint8_t slices[PTL_NET_OP_KINDS], ptl_net_op *ops)
{
    const int nv = net->nvalues, nops = net->nops;
    memcpy(ops, net->ops, (size_t)nops * sizeof *ops);
    /* per value its one producer, writing it as `out` (-1: none, -2: several, or as out2 or z) */
    int *producer = malloc((size_t)(nv ? nv : 1) * sizeof(int));
    if (!producer)
        return oom();
    for (int v = 0; v < nv; v++)
        producer[v] = -1;
    for (int i = 0; i < nops; i++) {
        const int outs[3] = {ops[i].out, ops[i].out2, ops[i].z};
        for (int j = 0; j < 3; j++)
            if (outs[j] >= 0)
                producer[outs[j]] = producer[outs[j]] == -1 && j == 0 ? i : -2;
    }
    int placed = 0;
    for (int k = 0; k < nops; k++) {
        if (ops[k].kind != PTL_OP_CAT || ops[k].nin < 2)
            continue;
        const int V = ops[k].out;
        for (int j = 0, at = 0; j < ops[k].nin; at += ops[k].ins[j].nc, j++) {
            if (!part_in_place(net, slices, ops, producer, k, j))
                continue;
            const int P = ops[k].ins[j].value, p = producer[P];
            ops[p].out = V;
            ops[p].out_c0 = at;
            ops[p].out_nc = net->values[P].C;
            for (int r = 0; r < nops; r++)
                for (int q = 0; q < ops[r].nin; q++)
                    if (ops[r].ins[q].value == P) {
                        ops[r].ins[q].value = V;
                        ops[r].ins[q].c0 += at;
                    }
            ops[k].grad_in &= (uint8_t)~(1u << j);
            ops[k].keep_in &= (uint8_t)~(1u << j);
            producer[P] = -2;
            placed++;
        }
    }
    free(producer);
    return placed;
}

/* ------------------------------------------------------------------------------------- branches */

static int root(int *parent, int i)
{
    while (parent[i] != i)
        i = parent[i] = parent[parent[i]];
    return i;
}

static void unite(int *parent, int i, int j) { parent[root(parent, i)] = root(parent, j); }

void ptl_net_branches_free(ptl_net_branches *br)
{
    free(br->op);
    memset(br, 0, sizeof *br);
}

/* Whether branch candidate r (a root of part[]) writes input j of op i's gradient from outside. */
static int writes_outside(const ptl_net_op *op, int j, const int *producer, int *part, int r)
{
    const int p = producer[op->ins[j].value];
    return (op->grad_in >> j & 1u) && (p < 0 || root(part, p) != r);
}

int ptl_net_branches_find(const ptl_network *net, ptl_net_branches *br)
{
    const int nops = net->nops, nv = net->nvalues;
    memset(br, 0, sizeof *br);
    int *producer = malloc((size_t)(nv ? nv : 1) * sizeof(int)), *readers = calloc((size_t)(nv ? nv : 1), sizeof(int));
    int *part = malloc((size_t)(nops ? nops : 1) * sizeof(int)), *state = calloc((size_t)(nops ? nops : 1), sizeof(int));
    br->op = calloc((size_t)(nops ? nops : 1), 1);
    if (!producer || !readers || !part || !state || !br->op) {
        free(producer);
        free(readers);
        free(part);
        free(state);
        ptl_net_branches_free(br);
        return oom();
    }
    for (int v = 0; v < nv; v++)
        producer[v] = -1;
    /* the ops writing one value (a Concat built in place) are one chain */
    for (int i = 0; i < nops; i++) {
        part[i] = i;
        const ptl_net_op *op = &net->ops[i];
        const int outs[2] = {op->out, op->out2};
        for (int k = 0; k < 2; k++)
            if (outs[k] >= 0) {
                if (producer[outs[k]] >= 0)
                    unite(part, i, producer[outs[k]]);
                producer[outs[k]] = i;
            }
        for (int j = 0; j < op->nin; j++)
            readers[op->ins[j].value]++;
    }
    /* chains: an op joins the producer of each input that it alone reads */
    for (int i = 0; i < nops; i++) {
        const ptl_net_op *op = &net->ops[i];
        for (int j = 0; j < op->nin; j++) {
            const int v = op->ins[j].value;
            if (producer[v] >= 0 && readers[v] == 1)
                unite(part, i, producer[v]);
        }
    }
    /* state per chain root: 1 read from outside (no branch), 2 writes a gradient outside (attached) */
    for (int i = 0; i < nops; i++) {
        const ptl_net_op *op = &net->ops[i];
        const int r = root(part, i);
        for (int j = 0; j < op->nin; j++) {
            const int p = producer[op->ins[j].value];
            if (p >= 0 && root(part, p) != r)
                state[root(part, p)] |= 1;
            if (writes_outside(op, j, producer, part, r))
                state[r] |= 2;
        }
    }
    /* chains of one kind that read a value from outside in common are one branch */
    for (int v = 0; v < nv; v++) {
        int kin[2] = {-1, -1};
        for (int i = 0; i < nops; i++) {
            const ptl_net_op *op = &net->ops[i];
            const int r = root(part, i);
            if (state[r] & 1)
                continue;
            for (int j = 0; j < op->nin; j++)
                if (op->ins[j].value == v && (producer[v] < 0 || root(part, producer[v]) != r)) {
                    const int a = state[r] >> 1 & 1;
                    if (kin[a] >= 0 && root(part, kin[a]) != r)
                        unite(part, r, kin[a]);
                    kin[a] = root(part, r);
                }
        }
    }
    /* A branch's fork, its join and whether its writes outside all come first, op by op; state of a root:
     * 1 no branch, 2 attached, and (bit 2) seen */
    for (int i = 0; i < nops && br->n < PTL_NET_MAX_BRANCHES; i++) {
        const int r = root(part, i);
        if (state[r] & 5)
            continue;
        state[r] |= 4;
        ptl_net_branch B = {0, -1, state[r] >> 1 & 1, i, i};
        int ok = 1;
        for (int k = i; k < nops; k++) {
            const ptl_net_op *op = &net->ops[k];
            if (root(part, k) != r)
                continue;
            B.last = k;
            for (int j = 0; j < op->nin; j++) {
                const int v = op->ins[j].value, p = producer[v];
                if (p >= 0 && root(part, p) == r)
                    continue;
                if (p + 1 > B.fork)
                    B.fork = p + 1;
                if (!writes_outside(op, j, producer, part, r))
                    continue;
                /* every writer of grad(v) outside comes later in the backward (has a lower index) */
                for (int u = 0; u < nops; u++) {
                    const ptl_net_op *w = &net->ops[u];
                    if (root(part, u) == r)
                        continue;
                    for (int jj = 0; jj < w->nin; jj++)
                        if (w->ins[jj].value == v && (w->grad_in >> jj & 1u)) {
                            ok &= u < k;
                            B.join = u > B.join ? u : B.join;
                        }
                }
                B.join = p > B.join ? p : B.join;
            }
        }
        if (!ok)
            continue;
        if (!B.attached)
            B.join = B.fork - 1;
        br->b[br->n++] = B;
    }
    /* order of fork, then of first op (insertion: a few entries) */
    for (int k = 1; k < br->n; k++)
        for (int m = k; m > 0; m--) {
            ptl_net_branch *x = &br->b[m - 1], *y = &br->b[m];
            if (x->fork < y->fork || (x->fork == y->fork && x->first < y->first))
                break;
            const ptl_net_branch t = *x;
            *x = *y;
            *y = t;
        }
    for (int k = 0; k < br->n; k++)
        for (int i = br->b[k].first; i <= br->b[k].last; i++)
            if (root(part, i) == root(part, br->b[k].first))
                br->op[i] = (uint8_t)(k + 1);
    free(producer);
    free(readers);
    free(part);
    free(state);
    return 0;
}

/* ---------------------------------------------------------------------------- weight-cast table */

void ptl_net_wtab_free(ptl_net_wtab *wt)
{
    free(wt->tab);
    free(wt->tiles);
    free(wt->op_w);
    free(wt->op_b);
    memset(wt, 0, sizeof *wt);
}

/* Every conv weight, then (for a conv with bias, when biases are cast) its bias, in op order. */
int ptl_net_wtab_build(const ptl_network *net, int cast_biases, ptl_net_wtab *wt)
{
    memset(wt, 0, sizeof *wt);
    int n = 0;
    for (int i = 0; i < net->nops; i++)
        if (is_conv(&net->ops[i]))
            n += net->ops[i].kind == PTL_OP_CONV_BIAS && cast_biases ? 2 : 1;
    wt->tab = calloc((size_t)(n ? n : 1), sizeof *wt->tab);
    wt->op_w = malloc((size_t)net->nops * sizeof(int64_t));
    wt->op_b = malloc((size_t)net->nops * sizeof(int64_t));
    if (!wt->tab || !wt->op_w || !wt->op_b) {
        ptl_net_wtab_free(wt);
        return oom();
    }
    int64_t cursor = 0;
    n = 0;
    for (int i = 0; i < net->nops; i++) {
        const ptl_net_op *op = &net->ops[i];
        wt->op_w[i] = wt->op_b[i] = -1;
        if (!is_conv(op))
            continue;
        const int cin_g = op->cin / op->g;
        wt->tab[n++] = (ptl_wcast_entry){op->param[PTL_CONV_W], cursor, op->cout, cin_g, op->k, 0};
        wt->op_w[i] = cursor;
        cursor += ptl_net_align_up((int64_t)op->cout * cin_g * op->k * op->k);
        if (op->kind == PTL_OP_CONV_BIAS && cast_biases) {
            wt->tab[n++] = (ptl_wcast_entry){op->param[PTL_CONV_BIAS], cursor, op->cout, 1, 1, 0};
            wt->op_b[i] = cursor;
            cursor += ptl_net_align_up(op->cout);
        }
    }
    wt->n = n;
    wt->total = cursor;
    const int ntiles = ptl_net_wcast_tiles(wt->tab, n, NULL);
    if (ntiles < 0 || !(wt->tiles = malloc((size_t)(ntiles ? ntiles : 1) * sizeof *wt->tiles))) {
        ptl_net_wtab_free(wt);
        return ntiles < 0 ? -1 : oom();
    }
    wt->ntiles = ptl_net_wcast_tiles(wt->tab, n, wt->tiles);
    return 0;
}

/* ------------------------------------------------------------------------------ memory layout */

void ptl_net_layout_free(ptl_net_layout *L)
{
    free(L->voff);
    free(L->goff);
    free(L->saved_off);
    free(L->ws_off);
    free(L->ws_numel);
    memset(L, 0, sizeof *L);
}

int ptl_net_layout_alloc(const ptl_network *net, ptl_net_layout *L)
{
    memset(L, 0, sizeof *L);
    L->voff = calloc((size_t)net->nvalues, sizeof(int64_t));
    L->goff = calloc((size_t)net->nvalues, sizeof(int64_t));
    L->saved_off = calloc((size_t)net->nops, sizeof(int64_t));
    L->ws_off = calloc((size_t)2 * net->nops, sizeof(int64_t));
    L->ws_numel = calloc((size_t)2 * net->nops, sizeof(int64_t));
    if (!L->voff || !L->goff || !L->saved_off || !L->ws_off || !L->ws_numel) {
        ptl_net_layout_free(L);
        return oom();
    }
    return 0;
}

/* Whether slots u and v may not share memory: their lives overlap, or, both in one side queue's serial
 * order (own[] the same queue; NULL: none), their lives on the plain clock (nat_*) do. */
static int conflict(int u, int v, const int *born, const int *dies, const uint8_t *own, const int *nat_born,
                    const int *nat_dies)
{
    if (own && own[u] && own[u] == own[v])
        return !(nat_dies[u] < nat_born[v] || nat_dies[v] < nat_born[u]);
    return !(dies[u] < born[v] || dies[v] < born[u]);
}

/* Slot placement order: largest first, then by birth, then index (a total order: the layout is the same
 * on every run and backend). */
typedef struct {
    int64_t size;
    int born, v;
} slot_key;

static int slot_key_cmp(const void *pa, const void *pb)
{
    const slot_key *a = pa, *b = pb;
    if (a->size != b->size)
        return a->size > b->size ? -1 : 1;
    if (a->born != b->born)
        return a->born < b->born ? -1 : 1;
    return a->v < b->v ? -1 : a->v > b->v;
}

/* An occupied range [lo, hi) of the arena. */
typedef struct {
    int64_t lo, hi;
} range;

static int range_cmp(const void *pa, const void *pb)
{
    const range *a = pa, *b = pb;
    return a->lo < b->lo ? -1 : a->lo > b->lo;
}

/* Placement of n slots, largest first, each at the lowest offset where it overlaps no slot placed before it
 * that it conflicts with (placing the large long-lived slots first leaves the small ones the gaps between
 * them: an arena ~5% smaller than first fit in order of birth for YOLO26); a slot born < 0 is not placed.
 * Returns the arena size in elements (-1: out of host memory). */
static int64_t place_slots(int n, const int *born, const int *dies, const uint8_t *own, const int *nat_born,
                           const int *nat_dies, const int64_t *size, int64_t *off)
{
    int64_t total = 0;
    slot_key *order = malloc((size_t)(n ? n : 1) * sizeof *order);
    int *placed = malloc((size_t)(n ? n : 1) * sizeof(int));
    range *busy = malloc((size_t)(n ? n : 1) * sizeof *busy);
    if (!order || !placed || !busy) {
        free(order);
        free(placed);
        free(busy);
        return oom();
    }
    int k = 0, np = 0;
    for (int v = 0; v < n; v++)
        if (born[v] >= 0)
            order[k++] = (slot_key){size[v], born[v], v};
    qsort(order, (size_t)k, sizeof *order, slot_key_cmp);
    for (int j = 0; j < k; j++) {
        const int v = order[j].v;
        int nb = 0;
        for (int q = 0; q < np; q++) {
            const int u = placed[q];
            if (conflict(u, v, born, dies, own, nat_born, nat_dies))
                busy[nb++] = (range){off[u], off[u] + size[u]};
        }
        qsort(busy, (size_t)nb, sizeof *busy, range_cmp);
        int64_t o = 0;
        for (int q = 0; q < nb && busy[q].lo < o + size[v]; q++)
            o = busy[q].hi > o ? busy[q].hi : o;
        off[v] = o;
        placed[np++] = v;
        total = o + size[v] > total ? o + size[v] : total;
    }
    free(order);
    free(placed);
    free(busy);
    return total;
}

/* The layout's clock: the image is written at 0, forward op i at i + 1, backward step t (op nops-1-t) at
 * nops + 1 + t, and the image gradient is read at 2 nops + 1, the end. */
static int fwd_time(int op) { return op + 1; }
static int bwd_time(const ptl_network *net, int step) { return net->nops + 1 + step; }
static int end_time(const ptl_network *net) { return 2 * net->nops + 1; }

/* A life [born, dies] (born >= 0) stretched to cover [t0, t1]. */
static void cover(int t0, int t1, int *born, int *dies)
{
    if (*born > t0)
        *born = t0;
    if (*dies < t1)
        *dies = t1;
}

/* The time by whose end branch b's backward is done: the step before its join op's (-1: the end). */
static int branch_end(const ptl_network *net, const ptl_net_branch *b)
{
    return b->join >= 0 ? bwd_time(net, net->nops - 2 - b->join) : end_time(net);
}

/* The lives of what runs beside the rest (ptl_net_concurrency); slots born < 0 are never placed. */
static void concurrent_lives(const ptl_network *net, const ptl_net_concurrency *cc, int fwd_only, int *born, int *dies)
{
    const int nv = net->nvalues, end = end_time(net), fend = fwd_time(net->nops - 1), b0 = bwd_time(net, 0);
    for (int i = 0; i < net->nops; i++) {
        const ptl_net_op *op = &net->ops[i];
        const int step = net->nops - 1 - i, b = ptl_net_branch_of(cc, i);
        /* a branch op's weight gradients run in its branch */
        if (!fwd_only && cc->side_lag > 1 && b < 0 && (op->kind == PTL_OP_CONV || op->kind == PTL_OP_CONV_BIAS)) {
            const int t = bwd_time(net, step + cc->side_lag - 1), last = t < end ? t : end;
            const int dy = nv + (op->kind == PTL_OP_CONV ? op->z : op->out);
            cover(born[op->ins[0].value], last, &born[op->ins[0].value], &dies[op->ins[0].value]);
            if (born[dy] >= 0)
                cover(born[dy], last, &born[dy], &dies[dy]);
        }
        if (b < 0)
            continue;
        /* activations: to the forward's end, or the branch's backward end if the op's backward reads them */
        const int f0 = fwd_time(cc->br->b[b].fork), bend = branch_end(net, &cc->br->b[b]);
        const int kept = fwd_only ? fend : bend;
        const int outs[3] = {op->out, op->z, op->out2};
        for (int j = 0; j < op->nin; j++) {
            const int v = op->ins[j].value;
            cover(born[v], op->keep_in >> j & 1u ? kept : fend, &born[v], &dies[v]);
            if (!fwd_only && born[nv + v] >= 0)
                cover(b0, bend, &born[nv + v], &dies[nv + v]);
        }
        for (int j = 0; j < 3; j++)
            if (outs[j] >= 0) {
                cover(f0, j == 1 ? kept : fend, &born[outs[j]], &dies[outs[j]]);
                if (!fwd_only && born[nv + outs[j]] >= 0)
                    cover(b0, bend, &born[nv + outs[j]], &dies[nv + outs[j]]);
            }
    }
}

/* With a side lag, a branch conv's weight and bias gradients run up to side_lag - 1 steps after its own on
 * the branch's clock (executor.c, branch_pass): what they read, the conv's input and its output's gradient,
 * lives on that clock (the natural lives, by which the branch queue's own slots share) until then. */
static void branch_lag_lives(const ptl_network *net, const ptl_net_concurrency *cc, int *nat_born, int *nat_dies)
{
    const int nv = net->nvalues;
    for (int i = 0; cc->side_lag > 1 && i < net->nops; i++) {
        const ptl_net_op *op = &net->ops[i];
        const int b = ptl_net_branch_of(cc, i);
        if (b < 0 || (op->kind != PTL_OP_CONV && op->kind != PTL_OP_CONV_BIAS))
            continue;
        const int t = bwd_time(net, net->nops - 1 - i + cc->side_lag - 1), bend = branch_end(net, &cc->br->b[b]);
        const int last = t < bend ? t : bend;
        const int read[2] = {op->ins[0].value, nv + (op->kind == PTL_OP_CONV ? op->z : op->out)};
        for (int j = 0; j < 2; j++)
            if (nat_born[read[j]] >= 0 && nat_dies[read[j]] < last)
                nat_dies[read[j]] = last;
    }
}

/* Which slots only one branch queue touches (own[], 1 + attached: the values its ops produce, and their
 * gradients), where that queue runs its branches in the ops' order (forward: in order of fork, backward: in
 * reverse, as the executor queues them), so that their lives on the plain clock order them; and each branch
 * queue's scratch (slot 2 nv + 1 + attached), for its ops' gradient writes that add, over its backward. */
static void branch_slots(const ptl_network *net, const ptl_net_grad_plan *gp, const ptl_net_concurrency *cc,
                         int fwd_only, const int64_t *size, uint8_t *own, int64_t *scratch, int *born, int *dies)
{
    const int nv = net->nvalues;
    int ordered[2] = {1, 1}, prev_last[2] = {-1, -1}, bend[2] = {-1, -1};
    for (int k = 0; k < cc->br->n; k++) {
        const ptl_net_branch *b = &cc->br->b[k];
        if (b->attached && !cc->attached)
            continue;
        ordered[b->attached] &= prev_last[b->attached] < b->first;
        prev_last[b->attached] = b->last;
        const int e = branch_end(net, b);
        bend[b->attached] = e > bend[b->attached] ? e : bend[b->attached];
    }
    for (int i = 0; i < net->nops; i++) {
        const int b = ptl_net_branch_of(cc, i);
        if (b < 0)
            continue;
        const ptl_net_op *op = &net->ops[i];
        const int a = cc->br->b[b].attached;
        const int outs[3] = {op->out, op->z, op->out2};
        for (int j = 0; j < 3; j++)
            if (ordered[a] && outs[j] >= 0)
                own[outs[j]] = own[nv + outs[j]] = (uint8_t)(1 + a);
        for (int j = 0; j < op->nin; j++)
            if ((op->grad_in & ~gp->first[i]) >> j & 1u && size[op->ins[j].value] > scratch[a])
                scratch[a] = size[op->ins[j].value];
    }
    for (int a = 0; a < 2; a++) {
        const int s = 2 * nv + 1 + a; /* unplaced (born -1) unless its queue adds */
        if (!fwd_only && scratch[a] > 0)
            born[s] = bwd_time(net, 0), dies[s] = bend[a];
    }
}

/* Activation lives: a value dies with its last reader, forward or backward. A backward reads the inputs
 * its op keeps (keep_in) and its op's inner value z, in the backward step of that op. forward_only: no
 * backward reads anything. */
static void activation_lives(const ptl_network *net, int forward_only, int *born, int *dies)
{
    for (int v = 0; v < net->nvalues; v++)
        born[v] = dies[v] = -1;
    born[net->input] = dies[net->input] = 0;
    for (int i = 0; i < net->nops; i++) {
        const ptl_net_op *op = &net->ops[i];
        const int t = fwd_time(i), tb = forward_only ? t : bwd_time(net, net->nops - 1 - i);
        for (int j = 0; j < op->nin; j++) {
            const int v = op->ins[j].value, last = op->keep_in >> j & 1u ? tb : t;
            if (dies[v] < last)
                dies[v] = last;
        }
        /* a Concat built in place has several producers: its value is born with the first */
        const int outs[3] = {op->out, op->z, op->out2};
        for (int j = 0; j < 3; j++) {
            const int v = outs[j], last = j == 1 ? tb : t;
            if (v < 0)
                continue;
            if (born[v] < 0)
                born[v] = t;
            if (dies[v] < last)
                dies[v] = last;
        }
    }
}

/* Marks the gradients that take an Add's output's gradient slot (alias[v], -1 on entry: the value whose slot
 * v's gradient takes). An Add's backward first writes an input's gradient as a copy of its output's, which nothing
 * reads after that step, so one slot serves both and the copy is skipped (ptl_net_add_backward): the same
 * bits without a copy. One input per Add, since the other's gradient then gets additions of its own. Not for
 * an output that is a slice of a Concat built in place, an input that is a slice of another value or the
 * image, nor an Add in a branch (its queue's own slots). */
static void add_aliases(const ptl_network *net, const ptl_net_grad_plan *gp, const ptl_net_concurrency *cc, int *alias)
{
    const int nops = net->nops;
    /* the backward's order, so an output's own alias (an Add that reads it) is known before its inputs' */
    for (int t = 0; t < nops; t++) {
        const int i = nops - 1 - t;
        const ptl_net_op *op = &net->ops[i];
        if (op->kind != PTL_OP_ADD || op->nin != 2 || op->out < 0 || op->out_nc || gp->dies[op->out] != t ||
            ptl_net_branch_of(cc, i) >= 0 || op->ins[0].value == op->ins[1].value)
            continue;
        for (int j = 1; j >= 0; j--) {
            const ptl_net_part *in = &op->ins[j];
            if (!(gp->first[i] >> j & 1u) || in->c0 || in->nc != net->values[in->value].C ||
                in->value == net->input || gp->zero_op[in->value] >= 0)
                continue;
            alias[in->value] = alias[op->out] >= 0 ? alias[op->out] : op->out;
            break;
        }
    }
}

int ptl_net_layout_build(const ptl_network *net, const ptl_net_grad_plan *gp, int B, int H, int W, int flags,
                         const ptl_net_concurrency *cc, const int64_t *op_ws, ptl_net_layout *L)
{
    if (B < 1)
        return ptl_set_error(PTL_ERR_VALUE, "images: batch size must be >= 1 (got %d)", B);
    if (H < 32 || W < 32 || H % 32 || W % 32)
        return ptl_set_error(PTL_ERR_VALUE, "images: height and width must be positive multiples of 32 (got %dx%d)",
                             H, W);
    /* the arena's slots: activations [0, nv), gradients [nv, 2 nv), the backward's scratch 2 nv, the branch
     * queues' scratch 2 nv + 1 (detached) and 2 nv + 2 (attached), the ops' workspaces 2 nv + 3 + (2 i, 2 i + 1) */
    const int nv = net->nvalues, nw = 2 * nv + 3, ns = nw + 2 * net->nops, end = end_time(net);
    int64_t *size = malloc((size_t)ns * sizeof(int64_t)), *off = malloc((size_t)ns * sizeof(int64_t));
    int *born = malloc((size_t)ns * sizeof(int)), *dies = malloc((size_t)ns * sizeof(int));
    /* the lives on the plain clock, and which slots only the branch queue touches (values its ops produce) */
    int *nat = malloc((size_t)2 * ns * sizeof(int)), *alias = malloc((size_t)(nv ? nv : 1) * sizeof(int));
    uint8_t *own = calloc((size_t)ns, 1);
    int64_t maxv = 0, saved = 0;
    if (!size || !off || !born || !dies || !nat || !alias || !own) {
        oom();
        goto fail;
    }
    L->B = B;
    L->H = H;
    L->W = W;
    for (int v = 0; v < nv; v++) {
        const int64_t n = ptl_net_value_dims(net, L, v).m * net->values[v].C;
        size[v] = size[nv + v] = ptl_net_align_up(n);
        maxv = n > maxv ? n : maxv;
    }
    size[2 * nv] = ptl_net_align_up(maxv);
    const int fwd_only = !!(flags & PTL_NET_FORWARD_ONLY);
    activation_lives(net, fwd_only, born, dies);
    for (int v = 0; v < nv; v++) {
        if (!(flags & PTL_NET_SHARE_ACTIVATIONS) && born[v] >= 0)
            born[v] = 0, dies[v] = end;
        const int g = nv + v;
        if (fwd_only || (flags & PTL_NET_SHARE_GRADIENTS && gp->born[v] < 0))
            born[g] = dies[g] = -1; /* never written nor read */
        else if (!(flags & PTL_NET_SHARE_GRADIENTS))
            born[g] = 0, dies[g] = end; /* every gradient its own slot, written or not */
        else
            born[g] = bwd_time(net, gp->born[v]), dies[g] = bwd_time(net, gp->dies[v]);
    }
    born[2 * nv] = fwd_only ? -1 : bwd_time(net, 0);
    dies[2 * nv] = fwd_only ? -1 : end;
    int64_t bscratch[2] = {0, 0};
    for (int s = 2 * nv + 1; s < ns; s++)
        born[s] = dies[s] = -1;
    for (int k = 0; k < 2 * net->nops; k++) {
        const int i = k / 2, step = k % 2, t = step ? bwd_time(net, net->nops - 1 - i) : fwd_time(i);
        size[nw + k] = ptl_net_align_up(op_ws && (!step || !fwd_only) ? op_ws[k] : 0);
        if (size[nw + k] > 0)
            born[nw + k] = dies[nw + k] = t;
    }
    memcpy(nat, born, (size_t)ns * sizeof(int));
    memcpy(nat + ns, dies, (size_t)ns * sizeof(int));
    if (cc)
        concurrent_lives(net, cc, fwd_only, born, dies);
    if (cc && cc->br) {
        branch_slots(net, gp, cc, fwd_only, size, own, bscratch, born, dies);
        if (!fwd_only)
            branch_lag_lives(net, cc, nat, nat + ns);
    }
    size[2 * nv + 1] = bscratch[0];
    size[2 * nv + 2] = bscratch[1];
    /* an aliased gradient's life joins its slot's (they meet at the Add's step) */
    L->grad_aliases = 0;
    for (int v = 0; v < nv; v++)
        alias[v] = -1;
    if (!fwd_only && (flags & PTL_NET_SHARE_GRADIENTS)) {
        add_aliases(net, gp, cc, alias);
        for (int v = 0; v < nv; v++) {
            const int g = nv + v, r = nv + alias[v];
            if (alias[v] < 0 || born[g] < 0 || born[r] < 0) {
                alias[v] = -1;
                continue;
            }
            cover(born[g], dies[g], &born[r], &dies[r]);
            cover(nat[g], nat[ns + g], &nat[r], &nat[ns + r]);
            own[r] = own[r] == own[g] ? own[r] : 0;
            born[g] = dies[g] = -1;
            L->grad_aliases++;
        }
    }
    if ((L->arena_numel = place_slots(ns, born, dies, own, nat, nat + ns, size, off)) < 0)
        goto fail;
    for (int v = 0; v < nv; v++) {
        const int g = nv + (alias[v] >= 0 ? alias[v] : v);
        L->voff[v] = born[v] >= 0 ? off[v] : 0;
        L->goff[v] = born[g] >= 0 ? off[g] : 0;
    }
    L->scratch_off = fwd_only ? 0 : off[2 * nv];
    for (int a = 0; a < 2; a++)
        L->branch_scratch_off[a] = born[2 * nv + 1 + a] >= 0 ? off[2 * nv + 1 + a] : 0;
    for (int k = 0; k < 2 * net->nops; k++) {
        L->ws_numel[k] = born[nw + k] >= 0 ? size[nw + k] : 0;
        L->ws_off[k] = born[nw + k] >= 0 ? off[nw + k] : 0;
    }
    L->forward_only = fwd_only;
    free(size);
    free(off);
    free(born);
    free(dies);
    free(nat);
    free(alias);
    free(own);
    for (int i = 0; i < net->nops; i++) {
        const ptl_net_op *op = &net->ops[i];
        const ptl_net_dims d = op->nin ? ptl_net_value_dims(net, L, op->ins[0].value) : (ptl_net_dims){0, 0, 0};
        L->saved_off[i] = saved;
        saved += ptl_net_align_up(ptl_net_op_saved_numel(op, B, d.h, d.w));
    }
    L->saved_numel = saved;
    L->A = 0;
    for (int l = 0; l < 3; l++) {
        L->level_off[l] = L->A;
        L->A += (int64_t)(H / net->stride[l]) * (W / net->stride[l]);
    }
    return 0;
fail:
    free(size);
    free(off);
    free(born);
    free(dies);
    free(nat);
    free(alias);
    free(own);
    L->B = 0;
    return -1;
}
