/* The per-request acceptance model's two loops, in C: the instruction's word slots, and the prediction's
 * weighted sums. Both run on every routed request, where the Python definitions
 * (gateway/routing/features.py, gateway/routing/alpha_model.py) cost about a fifth of the routing decision;
 * the results are the same (tests/routing/test_slots.py), so the module is optional.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static uint32_t crc_table[256];

static void crc_init(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[n] = c;
    }
}

/* zlib's crc32, continued from ``crc`` (the running value, not yet inverted) */
static inline uint32_t crc_feed(uint32_t crc, const unsigned char *p, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        crc = crc_table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return crc;
}

/* a code point as UTF-8; 0 for a surrogate, which ``str.encode`` refuses */
static inline int utf8(Py_UCS4 c, unsigned char *out)
{
    if (c < 0x80) {
        out[0] = (unsigned char)c;
        return 1;
    }
    if (c < 0x800) {
        out[0] = (unsigned char)(0xC0 | (c >> 6));
        out[1] = (unsigned char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c >= 0xD800 && c <= 0xDFFF)
        return 0;
    if (c < 0x10000) {
        out[0] = (unsigned char)(0xE0 | (c >> 12));
        out[1] = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
        out[2] = (unsigned char)(0x80 | (c & 0x3F));
        return 3;
    }
    out[0] = (unsigned char)(0xF0 | (c >> 18));
    out[1] = (unsigned char)(0x80 | ((c >> 12) & 0x3F));
    out[2] = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
    out[3] = (unsigned char)(0x80 | (c & 0x3F));
    return 4;
}

/* ``[a-z0-9_]``: a word character of the lowered window */
static inline int word_char(Py_UCS4 c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
}

#define MAX_WORDS 64

typedef struct {
    Py_ssize_t start, len; /* a run of word characters, or one other character (len 1) */
} Token;

/* the CRC of one token's UTF-8 bytes, continued from ``crc``; -1 on a surrogate */
static inline int64_t crc_token(uint32_t crc, int kind, const void *data, const Token *t)
{
    unsigned char buf[4];
    for (Py_ssize_t j = 0; j < t->len; j++) {
        int n = utf8(PyUnicode_READ(kind, data, t->start + j), buf);
        if (!n)
            return -1;
        crc = crc_feed(crc, buf, n);
    }
    return crc;
}

/* word_slots(window, max_words, mask) -> tuple[int, ...] | None
 *
 * ``re.findall(r"[a-z0-9_]+|[^\sa-z0-9_]", window)[:max_words]``, each word and each two neighbours joined
 * by a space, named ``"w=" + gram`` and hashed as ``zlib.crc32(name.encode()) & mask``: the words' slots,
 * then the pairs'. None where ``window`` holds a surrogate (the caller's Python definition says what then).
 */
static PyObject *word_slots(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyUnicode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "word_slots(window: str, max_words: int, mask: int)");
        return NULL;
    }
    PyObject *text = args[0];
    Py_ssize_t max_words = PyLong_AsSsize_t(args[1]);
    long mask = PyLong_AsLong(args[2]);
    if ((max_words == -1 || mask == -1) && PyErr_Occurred())
        return NULL;
    if (max_words < 0 || max_words > MAX_WORDS) {
        PyErr_SetString(PyExc_ValueError, "max_words out of range");
        return NULL;
    }
#if PY_VERSION_HEX < 0x030C0000
    /* Python 3.11 may hold a str in its legacy form until it is made ready, as classifiers/_grams.c does */
    if (PyUnicode_READY(text) == -1)
        return NULL;
#endif
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t len = PyUnicode_GET_LENGTH(text);
    Token tokens[MAX_WORDS];
    Py_ssize_t n = 0, i = 0;
    while (i < len && n < max_words) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (word_char(c)) {
            Py_ssize_t j = i + 1;
            while (j < len && word_char(PyUnicode_READ(kind, data, j)))
                j++;
            tokens[n].start = i;
            tokens[n++].len = j - i;
            i = j;
        } else {
            if (!Py_UNICODE_ISSPACE(c)) {
                tokens[n].start = i;
                tokens[n++].len = 1;
            }
            i++;
        }
    }
    Py_ssize_t pairs = n > 1 ? n - 1 : 0;
    PyObject *out = PyTuple_New(n + pairs);
    if (out == NULL)
        return NULL;
    const uint32_t prefix = crc_feed(0xFFFFFFFFu, (const unsigned char *)"w=", 2);
    const unsigned char sep = ' ';
    int64_t prev = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        int64_t h = crc_token(prefix, kind, data, &tokens[k]);
        if (h < 0)
            goto surrogate;
        PyObject *slot = PyLong_FromLong((long)((~(uint32_t)h) & (uint32_t)mask));
        if (slot == NULL)
            goto error;
        PyTuple_SET_ITEM(out, k, slot);
        if (k > 0) {
            /* the pair "w=" + previous + " " + this: the previous word's running CRC, continued */
            int64_t p = crc_token(crc_feed((uint32_t)prev, &sep, 1), kind, data, &tokens[k]);
            slot = PyLong_FromLong((long)((~(uint32_t)p) & (uint32_t)mask));
            if (slot == NULL)
                goto error;
            PyTuple_SET_ITEM(out, n + k - 1, slot);
        }
        prev = h;
    }
    return out;
surrogate:
    Py_DECREF(out);
    Py_RETURN_NONE;
error:
    Py_DECREF(out);
    return NULL;
}

/* weighted(slots, values, mean, var, stamp, start, now, horizon) -> (m, v, x2) | None
 *
 * The prediction's sums in the slots' order, as the Python loop adds them: ``m = start + Σ x·mean[s]``,
 * ``v = Σ x²·var[s]``, ``x2 = Σ x²``. None when a slot was last touched more than ``horizon`` before
 * ``now`` (its forgetting is the caller's to apply first).
 */
static PyObject *weighted(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8 || !PyTuple_Check(args[0]) || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "weighted(slots: tuple, values: tuple, mean, var, stamp, start, now, horizon)");
        return NULL;
    }
    PyObject *slots = args[0], *values = args[1];
    Py_ssize_t n = PyTuple_GET_SIZE(slots);
    if (PyTuple_GET_SIZE(values) != n) {
        PyErr_SetString(PyExc_ValueError, "slots and values differ in length");
        return NULL;
    }
    double m = PyFloat_AsDouble(args[5]), now = PyFloat_AsDouble(args[6]), horizon = PyFloat_AsDouble(args[7]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer bufs[3];
    int got = 0;
    PyObject *result = NULL;
    for (; got < 3; got++) {
        if (PyObject_GetBuffer(args[2 + got], &bufs[got], PyBUF_FORMAT) < 0)
            goto done;
        if (bufs[got].format == NULL || strcmp(bufs[got].format, "d") != 0 || bufs[got].itemsize != 8) {
            PyBuffer_Release(&bufs[got]);
            PyErr_SetString(PyExc_TypeError, "mean, var and stamp must be arrays of doubles");
            goto done;
        }
    }
    const double *mean = bufs[0].buf, *var = bufs[1].buf, *stamp = bufs[2].buf;
    Py_ssize_t size = bufs[0].len / 8;
    if (bufs[1].len / 8 < size)
        size = bufs[1].len / 8;
    if (bufs[2].len / 8 < size)
        size = bufs[2].len / 8;
    double v = 0.0, x2 = 0.0;
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t s = PyLong_AsSsize_t(PyTuple_GET_ITEM(slots, k));
        if (s == -1 && PyErr_Occurred())
            goto done;
        if (s < 0 || s >= size) {
            PyErr_SetString(PyExc_IndexError, "slot out of range");
            goto done;
        }
        if (now - stamp[s] > horizon) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        double x = PyFloat_AsDouble(PyTuple_GET_ITEM(values, k));
        if (x == -1.0 && PyErr_Occurred())
            goto done;
        m += x * mean[s];
        double sq = x * x;
        v += sq * var[s];
        x2 += sq;
    }
    result = Py_BuildValue("(ddd)", m, v, x2);
done:
    while (got > 0)
        PyBuffer_Release(&bufs[--got]);
    return result;
}

static PyMethodDef module_methods[] = {
    {"word_slots", (PyCFunction)(void (*)(void))word_slots, METH_FASTCALL,
     "The instruction window's word and word-pair slots."},
    {"weighted", (PyCFunction)(void (*)(void))weighted, METH_FASTCALL,
     "The acceptance prediction's weighted sums over the request's slots."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef slots_module = {
    PyModuleDef_HEAD_INIT, "_slots", "The acceptance model's per-request loops in C.", -1, module_methods,
};

PyMODINIT_FUNC PyInit__slots(void)
{
    crc_init();
    return PyModule_Create(&slots_module);
}
