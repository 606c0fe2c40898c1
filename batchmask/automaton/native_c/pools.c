/* Growable int64 arrays and a map from int64 sequences to dense ids (open addressing; native.h). */
#include "native.h"

int reserve(Vec *v, int64_t extra)
{
    if (v->n + extra <= v->cap)
        return 0;
    int64_t cap = v->cap ? v->cap : 64;
    while (cap < v->n + extra)
        cap *= 2;
    int64_t *a = realloc(v->a, (size_t)cap * sizeof(int64_t));
    if (!a) {
        PyErr_NoMemory();
        return -1;
    }
    v->a = a;
    v->cap = cap;
    return 0;
}

int grow_to(Vec *v, int64_t n, int64_t fill)
{
    if (n <= v->n)
        return 0;
    if (reserve(v, n - v->n) < 0)
        return -1;
    while (v->n < n)
        v->a[v->n++] = fill;
    return 0;
}

uint64_t seq_hash(const int64_t *s, int64_t n)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
    for (int64_t i = 0; i < n; i++) {
        h ^= (uint64_t)s[i] + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
        h *= 0xff51afd7ed558ccdull;
    }
    return h ^ (h >> 33);
}

int64_t seq_find(const SeqMap *m, const int64_t *s, int64_t n, uint64_t h)
{
    if (!m->nslot)
        return -1;
    for (int64_t at = (int64_t)(h & (uint64_t)(m->nslot - 1));; at = (at + 1) & (m->nslot - 1)) {
        int64_t id = m->slot[at] - 1;
        if (id < 0)
            return -1;
        if ((uint64_t)m->hash.a[id] == h && m->len.a[id] == n && !memcmp(m->data.a + m->off.a[id], s, n * 8))
            return id;
    }
}

static int place(SeqMap *m, int64_t id)
{
    for (int64_t at = (int64_t)((uint64_t)m->hash.a[id] & (uint64_t)(m->nslot - 1));; at = (at + 1) & (m->nslot - 1))
        if (!m->slot[at]) {
            m->slot[at] = id + 1;
            return 0;
        }
}

/* adds s (not already there, not pointing into m) as the next id */
int64_t seq_add(SeqMap *m, const int64_t *s, int64_t n, uint64_t h)
{
    int64_t id = m->off.n;
    if (2 * (id + 1) > m->nslot) {
        int64_t ns = m->nslot ? 2 * m->nslot : 1024;
        int64_t *slot = calloc((size_t)ns, sizeof(int64_t));
        if (!slot) {
            PyErr_NoMemory();
            return -1;
        }
        free(m->slot);
        m->slot = slot;
        m->nslot = ns;
        for (int64_t k = 0; k < id; k++)
            place(m, k);
    }
    if (push(&m->off, m->data.n) < 0 || push(&m->len, n) < 0 || push(&m->hash, (int64_t)h) < 0 ||
        reserve(&m->data, n) < 0)
        return -1;
    memcpy(m->data.a + m->data.n, s, n * 8);
    m->data.n += n;
    place(m, id);
    return id;
}

void seq_free(SeqMap *m)
{
    free(m->data.a); free(m->off.a); free(m->len.a); free(m->hash.a); free(m->slot);
}
