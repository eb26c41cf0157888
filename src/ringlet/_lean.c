/* ringlet._lean: the compiled small-message path of ringlet's shared-memory transport.
 *
 * One call does what the Python path does for a small all_reduce (sum) on one host,
 * through the same shared memory and in the same order, so that ranks taking either
 * path pair up and get the same bits (see ringlet/lean.py):
 *
 *   1. copy x into this rank's one-shot area, half seq % 2;
 *   2. publish the call's descriptor words, the sequence number last (release);
 *   3. wait, briefly, for every peer's descriptor of the same call (acquire) and compare
 *      it with this rank's;
 *   4. x = area[0] (rank 0: its own x), then x += area[q] for q = 1 .. n-1, elementwise.
 *
 * Anything out of the ordinary returns to Python before step 1 (NOT_LEAN: an array or a
 * size this path does not take; UNAPPROVED: a size the automatic choice has not yet been
 * asked about, see Lean.approve) or after step 2 (PUBLISHED: a peer not there within the
 * wait budget, or a descriptor that differs), and the Python path then runs the whole
 * call again from the start: it writes the same bytes and words again, which peers may
 * read at any time, and then waits with deadlines, liveness checks and the messages of
 * a mismatch.  Step 4 is IEEE addition element by element in rank order, as numpy's add
 * does it; integers wrap (unsigned arithmetic), as numpy's do.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <sched.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#define DESC_WORDS 16          /* per half: the sequence number and 15 descriptor words */
#define SHAPE_DIMS 6
#define MAX_RANKS 64

enum { NOT_LEAN = 0, DONE = 1, PUBLISHED = 2, UNAPPROVED = 3 };
enum { K_F32 = 0, K_F64 = 1, K_I32 = 2, K_I64 = 3, K_NONE = -1 };

typedef struct {
    PyObject_HEAD
    int rank, size;
    int64_t *desc[MAX_RANKS];          /* each rank's 2 x DESC_WORDS descriptor words */
    char *post[MAX_RANKS][2];          /* each rank's one-shot halves */
    Py_ssize_t post_bytes;
    int64_t coll, op, algo, path;      /* the descriptor's constant words */
    int64_t codes[4];                  /* ringlet dtype code of float32, float64, int32, int64 */
    PyObject *ndarray;                 /* the one array type taken (exactly) */
    PyObject *keep;                    /* what the pointers point into: kept alive */
    unsigned char *approved;           /* approved[nbytes]: the automatic choice is this path */
    int64_t spin_ns, wait_ns;          /* poll this long, then yield, give up after wait_ns */
    /* the flight recorder's ring of calls done here: seq, start time, 15 words each */
    int64_t *ring;
    Py_ssize_t cap;
    Py_ssize_t next;                   /* the ring's next entry */
    int recording;                     /* write the ring (on unless turned off: a benchmark) */
    int64_t calls;                     /* calls done here (tests read it) */
} Lean;

static inline int64_t clock_ns(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline int64_t now_ns(void) { return clock_ns(CLOCK_MONOTONIC); }

/* a flight record's start time: the same clock at the kernel tick's resolution (a few ms),
 * read from memory in ~3 ns where the precise one takes ~20 ns, 7 % of a 0.3 us call */
static inline int64_t stamp_ns(void) { return clock_ns(CLOCK_MONOTONIC_COARSE); }

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int kind_of(const char *fmt, Py_ssize_t itemsize) {
    if (fmt == NULL || fmt[0] == '\0' || fmt[1] != '\0')
        return K_NONE;                 /* byte-order prefixes, structs: the Python path */
    switch (fmt[0]) {
    case 'f': return itemsize == 4 ? K_F32 : K_NONE;
    case 'd': return itemsize == 8 ? K_F64 : K_NONE;
    case 'i': return itemsize == 4 ? K_I32 : K_NONE;
    case 'l': case 'q': return itemsize == 8 ? K_I64 : itemsize == 4 ? K_I32 : K_NONE;
    default: return K_NONE;
    }
}

/* dst += src, elementwise.  Which NaN an addition of two NaNs returns depends on which
 * operand the instruction takes first, so every rank must add every element with the same
 * instructions: the loops below have a structure that depends on n alone (4 or 2 lanes of
 * SSE2, then a scalar tail; no vectoriser, which may peel a head depending on the
 * addresses), and the Python path's one-shot reduction calls this same kernel (add()
 * below) wherever the module is built, so both paths give the same bits. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-vectorize")))
#endif
static void add(void *dst, const void *src, Py_ssize_t n, int kind) {
    Py_ssize_t i = 0;
    switch (kind) {
    case K_F32: {
        float *d = dst; const float *s = src;
#ifdef __SSE2__
        for (; i + 4 <= n; i += 4)
            _mm_storeu_ps(d + i, _mm_add_ps(_mm_loadu_ps(d + i), _mm_loadu_ps(s + i)));
#endif
        for (; i < n; i++) d[i] = d[i] + s[i];
        break;
    }
    case K_F64: {
        double *d = dst; const double *s = src;
#ifdef __SSE2__
        for (; i + 2 <= n; i += 2)
            _mm_storeu_pd(d + i, _mm_add_pd(_mm_loadu_pd(d + i), _mm_loadu_pd(s + i)));
#endif
        for (; i < n; i++) d[i] = d[i] + s[i];
        break;
    }
    case K_I32: {   /* integers: exact whatever the order, and they wrap as numpy's do */
        uint32_t *d = dst; const uint32_t *s = src;
        for (; i < n; i++) d[i] = d[i] + s[i];
        break;
    }
    case K_I64: {
        uint64_t *d = dst; const uint64_t *s = src;
        for (; i < n; i++) d[i] = d[i] + s[i];
        break;
    }
    }
}

/* add(dst, src): dst += src for two C-contiguous arrays of the same element type (float32,
 * float64, int32, int64) and size: the one-shot reduction's kernel for the Python path */
static PyObject *module_add(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "add(dst, src)");
        return NULL;
    }
    Py_buffer d, s;
    if (PyObject_GetBuffer(args[0], &d, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &s, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&d);
        return NULL;
    }
    int kind = kind_of(d.format, d.itemsize);
    if (kind == K_NONE || kind_of(s.format, s.itemsize) != kind || s.len != d.len) {
        PyBuffer_Release(&s);
        PyBuffer_Release(&d);
        PyErr_SetString(PyExc_TypeError, "add: two arrays of one of float32, float64, int32, "
                        "int64 and the same size");
        return NULL;
    }
    add(d.buf, s.buf, d.len / d.itemsize, kind);
    PyBuffer_Release(&s);
    PyBuffer_Release(&d);
    Py_RETURN_NONE;
}

/* n bytes from s to d with non-temporal stores where the CPU has them (SSE2): the
 * destination's lines are written without being read first and without displacing the
 * caches, a third less memory traffic than a plain copy into memory that is not cached */
static void copy_stream(char *d, const char *s, Py_ssize_t n) {
#ifdef __SSE2__
    Py_ssize_t head = (Py_ssize_t)((16 - ((uintptr_t)d & 15)) & 15);
    if (head > n)
        head = n;
    memcpy(d, s, (size_t)head);
    d += head;
    s += head;
    n -= head;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
    }
    _mm_sfence();
#endif
    memcpy(d, s, (size_t)n);
}

/* copy_stream(dst, src): dst[:] = src for two C-contiguous buffers of the same size in bytes
 * (any element type), with non-temporal stores; the GIL is released while it copies */
static PyObject *module_copy_stream(PyObject *Py_UNUSED(m), PyObject *const *args,
                                    Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "copy_stream(dst, src)");
        return NULL;
    }
    Py_buffer d, s;
    if (PyObject_GetBuffer(args[0], &d, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &s, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&d);
        return NULL;
    }
    if (s.len != d.len) {
        PyBuffer_Release(&s);
        PyBuffer_Release(&d);
        PyErr_SetString(PyExc_ValueError, "copy_stream: buffers of different sizes");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    copy_stream(d.buf, s.buf, d.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&s);
    PyBuffer_Release(&d);
    Py_RETURN_NONE;
}

/* --- small point-to-point messages on a shared-memory channel --------------------------
 *
 * A channel (ringlet/transport/shm.py, _Channel) is a single-producer single-consumer ring
 * of K slots of F bytes: the producer's count at ctrl (head), the consumer's at ctrl + 64
 * (tail), each slot's length at ctrl + 128 + 8 i.  A point-to-point message of
 * ringlet/p2p.py is a frame of `frame` bytes in one slot (`head` bytes of header: the words
 * magic, tag, bytes, dtype code, flags; then an inline payload) and, when the payload is
 * not inline, the payload in the next slots, min(F, what is left) bytes each.  p2p_push
 * and p2p_take move one whole message as the Python path's SendReq and RecvReq would, and
 * leave everything else to it. */

static inline int64_t load_acq(const int64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void store_rel(int64_t *p, int64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

/* the slots a message of `len` payload bytes takes: its frame, and the payload's own unless
 * it is inline */
static inline int64_t p2p_slots(int64_t len, int64_t frame, int64_t head, int64_t F) {
    return len <= frame - head ? 1 : 1 + (len + F - 1) / F;
}

/* copies of more than this many bytes let other threads run */
#define P2P_BIG (64 << 10)

/* the arguments p2p_push and p2p_take share: (ctrl, data, K, F, count, frame, head, magic,
 * flags, tag, code) into v, after a check of their number; -1 with an exception set */
static int p2p_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want,
                    const char *name, int64_t v[11]) {
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s: %zd arguments", name, want);
        return -1;
    }
    for (int i = 0; i < 11; i++) {
        v[i] = PyLong_AsLongLong(args[i]);
        if (v[i] == -1 && PyErr_Occurred())
            return -1;
    }
    if (v[5] > v[3] || v[6] < 64 || v[6] > v[5] || v[2] <= 0) {
        PyErr_Format(PyExc_ValueError, "%s: a frame that does not fit a slot", name);
        return -1;
    }
    return 0;
}

/* p2p_push(ctrl, data, K, F, count, frame, head, magic, flags, tag, code, payload) -> the
 * producer's new count, or -1 when the ring has no room for the whole message (nothing
 * written); `flags` is the inline flag, set in the frame when the payload is inline */
static PyObject *module_p2p_push(PyObject *Py_UNUSED(m), PyObject *const *args,
                                 Py_ssize_t nargs) {
    int64_t v[11];
    if (p2p_args(args, nargs, 12, "p2p_push", v) < 0)
        return NULL;
    char *ctrl = (char *)(intptr_t)v[0], *data = (char *)(intptr_t)v[1];
    int64_t K = v[2], F = v[3], count = v[4], frame = v[5], head = v[6];
    Py_buffer b;
    if (PyObject_GetBuffer(args[11], &b, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    int64_t len = (int64_t)b.len, n = p2p_slots(len, frame, head, F);
    int64_t *headp = (int64_t *)ctrl, *tailp = (int64_t *)(ctrl + 64);
    int64_t *lens = (int64_t *)(ctrl + 128);
    if (n > K || count + n - load_acq(tailp) > K) {
        PyBuffer_Release(&b);
        return PyLong_FromLong(-1);
    }
    int inline_ = n == 1;
    char *slot = data + (count % K) * F;
    int64_t words[8] = {v[7], v[9], len, v[10], inline_ ? v[8] : 0, 0, 0, 0};
    memcpy(slot, words, sizeof words);
    memset(slot + sizeof words, 0, (size_t)(frame - (int64_t)sizeof words));
    lens[count % K] = frame;
    if (inline_) {
        memcpy(slot + head, b.buf, (size_t)len);
    } else {
        const char *src = (const char *)b.buf;
        PyThreadState *ts = len > P2P_BIG ? PyEval_SaveThread() : NULL;
        for (int64_t i = 1, off = 0; i < n; i++) {
            int64_t k = (count + i) % K, m = len - off < F ? len - off : F;
            memcpy(data + k * F, src + off, (size_t)m);
            lens[k] = m;
            off += m;
        }
        if (ts != NULL)
            PyEval_RestoreThread(ts);
    }
    PyBuffer_Release(&b);
    store_rel(headp, count + n);
    return PyLong_FromLongLong(count + n);
}

/* p2p_take(ctrl, data, K, F, count, frame, head, magic, flags, tag, code, out, spin_ns)
 * -> the consumer's new count when the message at the head of the ring has `tag` (-1: any)
 * and fits `out` exactly (bytes and dtype code), and all of it has arrived: copied into out
 * and consumed; -1 when nothing arrived within spin_ns (polled with the GIL released, as
 * is the rest of a message whose frame came); -2 when the message there is any other, or
 * not all there: nothing consumed, it is left for the Python path */
static PyObject *module_p2p_take(PyObject *Py_UNUSED(m), PyObject *const *args,
                                 Py_ssize_t nargs) {
    int64_t v[11];
    if (p2p_args(args, nargs, 13, "p2p_take", v) < 0)
        return NULL;
    int64_t spin_ns = PyLong_AsLongLong(args[12]);
    if (spin_ns == -1 && PyErr_Occurred())
        return NULL;
    char *ctrl = (char *)(intptr_t)v[0], *data = (char *)(intptr_t)v[1];
    int64_t K = v[2], F = v[3], count = v[4], frame = v[5], head = v[6];
    int64_t *headp = (int64_t *)ctrl, *tailp = (int64_t *)(ctrl + 64);
    const int64_t *lens = (const int64_t *)(ctrl + 128);
    Py_buffer b;
    if (PyObject_GetBuffer(args[11], &b, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        return NULL;
    int64_t len = (int64_t)b.len, n = p2p_slots(len, frame, head, F);
    int64_t end = 0;
    if (load_acq(headp) == count && spin_ns > 0) {
        Py_BEGIN_ALLOW_THREADS
        end = now_ns() + spin_ns;
        while (load_acq(headp) == count) {
            cpu_relax();
            if (now_ns() >= end)
                break;
        }
        Py_END_ALLOW_THREADS
    }
    if (load_acq(headp) == count) {
        PyBuffer_Release(&b);
        return PyLong_FromLong(-1);
    }
    const char *slot = data + (count % K) * F;
    int64_t w[5];
    memcpy(w, slot, sizeof w);
    int inline_ = (w[4] & v[8]) != 0;
    if (lens[count % K] != frame || w[0] != v[7] || (v[9] != -1 && w[1] != v[9]) ||
            w[2] != len || w[3] != v[10] || inline_ != (n == 1) || n > K) {
        PyBuffer_Release(&b);
        return PyLong_FromLong(-2);
    }
    if (inline_) {
        memcpy(b.buf, slot + head, (size_t)len);
    } else {
        /* the payload follows its frame: wait for the rest within the spin, if any */
        int whole = load_acq(headp) - count >= n;
        if (!whole && spin_ns > 0) {
            Py_BEGIN_ALLOW_THREADS
            if (!end)
                end = now_ns() + spin_ns;
            while (!(whole = load_acq(headp) - count >= n) && now_ns() < end)
                cpu_relax();
            Py_END_ALLOW_THREADS
        }
        int ok = whole;
        for (int64_t i = 1, off = 0; ok && i < n; i++) {
            int64_t m = len - off < F ? len - off : F;
            ok = lens[(count + i) % K] == m;
            off += m;
        }
        if (!ok) {
            PyBuffer_Release(&b);
            return PyLong_FromLong(-2);
        }
        char *dst = (char *)b.buf;
        PyThreadState *ts = len > P2P_BIG ? PyEval_SaveThread() : NULL;
        for (int64_t i = 1, off = 0; i < n; i++) {
            int64_t m = len - off < F ? len - off : F;
            memcpy(dst + off, data + ((count + i) % K) * F, (size_t)m);
            off += m;
        }
        if (ts != NULL)
            PyEval_RestoreThread(ts);
    }
    PyBuffer_Release(&b);
    store_rel(tailp, count + n);
    return PyLong_FromLongLong(count + n);
}

static PyMethodDef module_methods[] = {
    {"add", (PyCFunction)(void (*)(void))module_add, METH_FASTCALL,
     "add(dst, src): dst += src elementwise (float32, float64, int32, int64), as the "
     "compiled one-shot all_reduce adds"},
    {"copy_stream", (PyCFunction)(void (*)(void))module_copy_stream, METH_FASTCALL,
     "copy_stream(dst, src): dst[:] = src (same size in bytes) with non-temporal stores"},
    {"p2p_push", (PyCFunction)(void (*)(void))module_p2p_push, METH_FASTCALL,
     "p2p_push(...): one whole point-to-point message onto a channel (see the source)"},
    {"p2p_take", (PyCFunction)(void (*)(void))module_p2p_take, METH_FASTCALL,
     "p2p_take(...): one whole point-to-point message off a channel (see the source)"},
    {NULL, NULL, 0, NULL},
};

/* all_reduce(x, seq[, out[, oneshot]]) -> NOT_LEAN, DONE, PUBLISHED or UNAPPROVED (see the
 * top of this file); with out (None: in place), x is read only and the result goes to out
 * (the same element type and count, any shape, x's own elements or none of them: else
 * NOT_LEAN, and Python says what is wrong); oneshot: the call asked for algorithm="oneshot", which runs
 * through the post area whenever the vector fits it (no automatic choice to ask) */
static PyObject *Lean_all_reduce(Lean *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 2 || nargs > 4) {
        PyErr_SetString(PyExc_TypeError, "all_reduce(x, seq[, out[, oneshot]])");
        return NULL;
    }
    PyObject *x = args[0], *o = nargs >= 3 && args[2] != Py_None ? args[2] : NULL;
    int asked = nargs == 4 && PyObject_IsTrue(args[3]) == 1;
    if ((PyObject *)Py_TYPE(x) != self->ndarray
            || (o != NULL && (PyObject *)Py_TYPE(o) != self->ndarray))
        return PyLong_FromLong(NOT_LEAN);
    int64_t seq = PyLong_AsLongLong(args[1]);
    if (seq == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer v, ov;
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (o == NULL ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(x, &v, flags) < 0) {
        PyErr_Clear();                 /* not writable or not contiguous: the Python path */
        return PyLong_FromLong(NOT_LEAN);
    }
    int kind = kind_of(v.format, v.itemsize);
    if (kind == K_NONE || v.len <= 0 || v.len > self->post_bytes || v.ndim > SHAPE_DIMS) {
        PyBuffer_Release(&v);
        return PyLong_FromLong(NOT_LEAN);
    }
    void *dst = v.buf;
    if (o != NULL) {
        if (PyObject_GetBuffer(o, &ov, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
            PyErr_Clear();
            PyBuffer_Release(&v);
            return PyLong_FromLong(NOT_LEAN);
        }
        char *a = v.buf, *b = ov.buf;
        /* out= overlapping x is the Python path's error; out= with x's very elements (x
         * itself, or another view of them) is in place, as there */
        if (kind_of(ov.format, ov.itemsize) != kind || ov.len != v.len
                || (a != b && a < b + ov.len && b < a + v.len)) {
            PyBuffer_Release(&ov);
            PyBuffer_Release(&v);
            return PyLong_FromLong(NOT_LEAN);
        }
        dst = ov.buf;
    }
    if (!asked && !self->approved[v.len]) {   /* Python asks the automatic choice, once */
        if (o != NULL)
            PyBuffer_Release(&ov);
        PyBuffer_Release(&v);
        return PyLong_FromLong(UNAPPROVED);
    }
    int64_t t0 = self->cap && self->recording ? stamp_ns() : 0;
    int64_t w[DESC_WORDS - 1];
    w[0] = self->coll; w[1] = self->op; w[2] = self->codes[kind];
    w[3] = v.len / v.itemsize; w[4] = 0; w[5] = self->algo; w[6] = self->path; w[7] = 0;
    w[8] = v.ndim;
    for (int d = 0; d < SHAPE_DIMS; d++)
        w[9 + d] = d < v.ndim ? (int64_t)v.shape[d] : 0;
    int h = (int)(seq & 1), me = self->rank, n = self->size;
    memcpy(self->post[me][h], v.buf, (size_t)v.len);
    int64_t *mine = self->desc[me] + h * DESC_WORDS;
    memcpy(mine + 1, w, sizeof w);
    __atomic_store_n(&mine[0], seq, __ATOMIC_RELEASE);
    /* wait for every peer's descriptor of this call */
    int code = DONE;
    int64_t start = 0;
    for (int q = 0; q < n && code == DONE; q++) {
        if (q == me)
            continue;
        int64_t *d = self->desc[q] + h * DESC_WORDS;
        while (__atomic_load_n(&d[0], __ATOMIC_ACQUIRE) != seq) {
            int64_t t = now_ns();
            if (!start)
                start = t;
            if (t - start >= self->wait_ns) {
                code = PUBLISHED;      /* Python waits on, with deadlines and liveness */
                break;
            }
            if (t - start < self->spin_ns)
                cpu_relax();
            else
                sched_yield();
        }
        if (code == DONE && memcmp(d + 1, w, sizeof w) != 0)
            code = PUBLISHED;          /* a mismatch: the Python path says what differs */
    }
    if (code == DONE) {                /* reduce in rank order */
        Py_ssize_t elems = v.len / v.itemsize;
        if (me != 0)
            memcpy(dst, self->post[0][h], (size_t)v.len);
        else if (dst != v.buf)
            memcpy(dst, v.buf, (size_t)v.len);
        for (int q = 1; q < n; q++)
            add(dst, self->post[q][h], elems, kind);
        if (self->cap && self->recording) {
            int64_t *r = self->ring + self->next * (DESC_WORDS + 1);
            self->next = self->next + 1 == self->cap ? 0 : self->next + 1;
            r[0] = seq;
            r[1] = t0;
            memcpy(r + 2, w, sizeof w);
        }
        self->calls++;
    }
    if (o != NULL)
        PyBuffer_Release(&ov);
    PyBuffer_Release(&v);
    return PyLong_FromLong(code);
}

static PyObject *Lean_approve(Lean *self, PyObject *arg) {
    Py_ssize_t nbytes = PyLong_AsSsize_t(arg);
    if (nbytes == -1 && PyErr_Occurred())
        return NULL;
    if (nbytes > 0 && nbytes <= self->post_bytes)
        self->approved[nbytes] = 1;
    Py_RETURN_NONE;
}

/* records() -> [(seq, t_start_ns, (15 words)), ...] of the calls done here */
static PyObject *Lean_records(Lean *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < self->cap; i++) {
        int64_t *r = self->ring + i * (DESC_WORDS + 1);
        if (r[0] <= 0)
            continue;
        PyObject *words = PyTuple_New(DESC_WORDS - 1);
        if (words == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        for (int k = 0; k < DESC_WORDS - 1; k++)
            PyTuple_SET_ITEM(words, k, PyLong_FromLongLong(r[2 + k]));
        PyObject *item = Py_BuildValue("(LLN)", (long long)r[0], (long long)r[1], words);
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(item);
    }
    return out;
}

static PyObject *Lean_get_calls(Lean *self, void *Py_UNUSED(closure)) {
    return PyLong_FromLongLong(self->calls);
}

static int address(PyObject *seq, Py_ssize_t i, void **out) {
    PyObject *o = PySequence_GetItem(seq, i);
    if (o == NULL)
        return -1;
    *out = PyLong_AsVoidPtr(o);
    Py_DECREF(o);
    return PyErr_Occurred() ? -1 : 0;
}

/* Lean(rank, size, desc_addrs, post_addrs, post_bytes, consts, codes, ndarray, keep,
 *      spin_ns, wait_ns, cap): the addresses are ints (desc_addrs[q]; post_addrs[2 q + h]),
 * consts = (collective, op, algorithm, path), codes = the dtype codes of float32, float64,
 * int32, int64; keep: the objects whose memory the addresses point into. */
static int Lean_init(Lean *self, PyObject *args, PyObject *Py_UNUSED(kwds)) {
    PyObject *desc, *post, *consts, *codes, *ndarray, *keep;
    Py_ssize_t post_bytes, cap;
    long long spin_ns, wait_ns;
    if (!PyArg_ParseTuple(args, "iiOOnOOOOLLn", &self->rank, &self->size, &desc, &post,
                          &post_bytes, &consts, &codes, &ndarray, &keep, &spin_ns, &wait_ns,
                          &cap))
        return -1;
    if (self->size < 1 || self->size > MAX_RANKS || self->rank < 0
            || self->rank >= self->size || post_bytes < 0 || cap < 0) {
        PyErr_SetString(PyExc_ValueError, "bad rank, size, post_bytes or capacity");
        return -1;
    }
    for (int q = 0; q < self->size; q++) {
        void *p;
        if (address(desc, q, &p) < 0)
            return -1;
        self->desc[q] = p;
        for (int h = 0; h < 2; h++) {
            if (address(post, 2 * q + h, &p) < 0)
                return -1;
            self->post[q][h] = p;
        }
    }
    if (!PyArg_ParseTuple(consts, "LLLL", (long long *)&self->coll, (long long *)&self->op,
                          (long long *)&self->algo, (long long *)&self->path))
        return -1;
    if (!PyArg_ParseTuple(codes, "LLLL", (long long *)&self->codes[0],
                          (long long *)&self->codes[1], (long long *)&self->codes[2],
                          (long long *)&self->codes[3]))
        return -1;
    self->post_bytes = post_bytes;
    PyMem_Free(self->approved);
    PyMem_Free(self->ring);
    self->approved = PyMem_Calloc((size_t)post_bytes + 1, 1);
    self->cap = cap;
    self->ring = cap ? PyMem_Calloc((size_t)cap * (DESC_WORDS + 1), sizeof(int64_t)) : NULL;
    if (self->approved == NULL || (cap && self->ring == NULL)) {
        PyErr_NoMemory();
        return -1;
    }
    Py_INCREF(ndarray);
    Py_XSETREF(self->ndarray, ndarray);
    Py_INCREF(keep);
    Py_XSETREF(self->keep, keep);
    self->spin_ns = spin_ns;
    self->wait_ns = wait_ns;
    self->recording = 1;
    return 0;
}

static void Lean_dealloc(Lean *self) {
    PyMem_Free(self->approved);
    PyMem_Free(self->ring);
    Py_XDECREF(self->ndarray);
    Py_XDECREF(self->keep);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Lean_methods[] = {
    {"all_reduce", (PyCFunction)(void (*)(void))Lean_all_reduce, METH_FASTCALL,
     "all_reduce(x, seq[, out[, oneshot]]) -> 0 (not this path), 1 (done), 2 (published: "
     "finish in Python) "
     "or 3 (a size not approved yet)"},
    {"approve", (PyCFunction)Lean_approve, METH_O,
     "approve(nbytes): the automatic choice runs this path for vectors of nbytes"},
    {"records", (PyCFunction)Lean_records, METH_NOARGS,
     "records() -> [(seq, t_start_ns, words)] of the calls done here"},
    {NULL, NULL, 0, NULL},
};

static PyObject *Lean_get_recording(Lean *self, void *Py_UNUSED(closure)) {
    return PyBool_FromLong(self->recording);
}

static int Lean_set_recording(Lean *self, PyObject *value, void *Py_UNUSED(closure)) {
    int on = value == NULL ? 0 : PyObject_IsTrue(value);
    if (on < 0)
        return -1;
    self->recording = on;
    return 0;
}

static PyGetSetDef Lean_getset[] = {
    {"calls", (getter)Lean_get_calls, NULL, "calls done here", NULL},
    {"recording", (getter)Lean_get_recording, (setter)Lean_set_recording,
     "whether calls go into the flight recorder's ring (the recorder's benchmark turns it "
     "off and on)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject LeanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ringlet._lean.Lean",
    .tp_basicsize = sizeof(Lean),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The compiled small all_reduce of one communicator (see ringlet.lean).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Lean_init,
    .tp_dealloc = (destructor)Lean_dealloc,
    .tp_methods = Lean_methods,
    .tp_getset = Lean_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "ringlet._lean",
    "The compiled small-message path of ringlet (optional; see ringlet.lean).", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__lean(void) {
    if (PyType_Ready(&LeanType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&LeanType);
    if (PyModule_AddObject(m, "Lean", (PyObject *)&LeanType) < 0) {
        Py_DECREF(&LeanType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "NOT_LEAN", NOT_LEAN) < 0
            || PyModule_AddIntConstant(m, "DONE", DONE) < 0
            || PyModule_AddIntConstant(m, "PUBLISHED", PUBLISHED) < 0
            || PyModule_AddIntConstant(m, "UNAPPROVED", UNAPPROVED) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
