/* Character n-gram scoring for the prompt classifier, without a Python object per gram; and the words of a
 * window read without the regex engine (``word_grams``, below), or straight into the same hashes
 * (``word_hashes``, summed by ``GramTable.sum`` and ``GramTable.bits``).
 *
 * ``classifiers.features`` reads a window of text as the set of its character n-grams and the model sums
 * the weights of the grams it knows, divided by the square root of the number of distinct grams. In
 * Python that means one string object per gram, hashed into a set and looked up in a dict: about half of
 * the classifier's time. Here a gram is hashed straight from the window's code points (64-bit FNV-1a over
 * whole code points, seeded with the gram's length, then a finaliser), deduplicated in a scratch table and
 * looked up in a table of the model's grams hashed the same way. The result is the same sum and count as
 * the Python sets give (``tests/classifiers/test_grams.py`` holds the two to each other); two different
 * grams of the model that hash alike are refused when the table is built, and the caller then keeps the
 * Python way.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Python 3.11 may still hold a str in its legacy form until it is made ready; from 3.12 every str is. */
#if PY_VERSION_HEX < 0x030C0000
#define MAKE_READY(op) PyUnicode_READY(op)
#else
#define MAKE_READY(op) 0
#endif

#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL
#define MAX_ORDER 16
#define STACK_SLOTS 4096

static inline uint64_t finish(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h ? h : 1; /* 0 marks an empty slot */
}

static inline uint64_t gram_hash(int kind, const void *data, Py_ssize_t start, Py_ssize_t n)
{
    uint64_t h = FNV_OFFSET ^ (uint64_t)n;
    for (Py_ssize_t j = 0; j < n; j++) {
        h = (h ^ (uint64_t)PyUnicode_READ(kind, data, start + j)) * FNV_PRIME;
    }
    return finish(h);
}

typedef struct {
    PyObject_HEAD
    uint64_t *keys;
    double *values;
    size_t mask;
    Py_ssize_t size;
} GramTable;

static void GramTable_dealloc(GramTable *self)
{
    PyMem_Free(self->keys);
    PyMem_Free(self->values);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static size_t slots_for(Py_ssize_t n)
{
    size_t slots = 16;
    while (slots < (size_t)n * 2 + 1) {
        slots <<= 1;
    }
    return slots;
}

static int GramTable_init(GramTable *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"weights", NULL};
    PyObject *weights;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!", kwlist, &PyDict_Type, &weights)) {
        return -1;
    }
    Py_ssize_t n = PyDict_Size(weights);
    size_t slots = slots_for(n);
    uint64_t *keys = PyMem_Calloc(slots, sizeof(uint64_t));
    double *values = PyMem_Calloc(slots, sizeof(double));
    if (keys == NULL || values == NULL) {
        PyMem_Free(keys);
        PyMem_Free(values);
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(weights, &pos, &key, &value)) {
        if (!PyUnicode_Check(key)) {
            PyErr_SetString(PyExc_TypeError, "gram table keys must be str");
            goto fail;
        }
        if (MAKE_READY(key) == -1) {
            goto fail;
        }
        double w = PyFloat_AsDouble(value);
        if (w == -1.0 && PyErr_Occurred()) {
            goto fail;
        }
        uint64_t h = gram_hash(PyUnicode_KIND(key), PyUnicode_DATA(key), 0, PyUnicode_GET_LENGTH(key));
        size_t i = (size_t)h & (slots - 1);
        while (keys[i] != 0) {
            if (keys[i] == h) {
                PyErr_Format(PyExc_ValueError, "two grams share a hash (one is %R)", key);
                goto fail;
            }
            i = (i + 1) & (slots - 1);
        }
        keys[i] = h;
        values[i] = w;
    }
    PyMem_Free(self->keys);
    PyMem_Free(self->values);
    self->keys = keys;
    self->values = values;
    self->mask = slots - 1;
    self->size = n;
    return 0;
fail:
    PyMem_Free(keys);
    PyMem_Free(values);
    return -1;
}

static inline double lookup(const GramTable *self, uint64_t h)
{
    size_t i = (size_t)h & self->mask;
    while (self->keys[i] != 0) {
        if (self->keys[i] == h) {
            return self->values[i];
        }
        i = (i + 1) & self->mask;
    }
    return 0.0;
}

PyDoc_STRVAR(score_doc,
             "score(text, orders) -> (sum, distinct)\n\n"
             "The summed weights of the distinct character n-grams of ``text`` (each order in ``orders``) and "
             "how many distinct grams there are, known to the table or not.");

/* The summed weights of the distinct grams of ``text`` of each order in ``order_of`` and how many distinct
   grams there are: ``GramTable.score`` and the scorer's character windows. */
static int gram_score(const GramTable *self, PyObject *text, const Py_ssize_t *order_of, Py_ssize_t norders,
                      double *sum_out, Py_ssize_t *distinct_out)
{
    Py_ssize_t len = PyUnicode_GET_LENGTH(text);
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t total = 0;
    for (Py_ssize_t k = 0; k < norders; k++) {
        if (len >= order_of[k]) {
            total += len - order_of[k] + 1;
        }
    }
    uint64_t stack[STACK_SLOTS];
    size_t slots = slots_for(total);
    uint64_t *seen = stack;
    if (slots > STACK_SLOTS) {
        seen = PyMem_Calloc(slots, sizeof(uint64_t));
        if (seen == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    else {
        memset(stack, 0, slots * sizeof(uint64_t));
    }
    size_t mask = slots - 1;
    double sum = 0.0;
    Py_ssize_t distinct = 0;
    for (Py_ssize_t k = 0; k < norders; k++) {
        Py_ssize_t n = order_of[k];
        for (Py_ssize_t i = 0; i + n <= len; i++) {
            uint64_t h = gram_hash(kind, data, i, n);
            size_t s = (size_t)h & mask;
            while (seen[s] != 0 && seen[s] != h) {
                s = (s + 1) & mask;
            }
            if (seen[s] == 0) {
                seen[s] = h;
                distinct++;
                sum += lookup(self, h);
            }
        }
    }
    if (seen != stack) {
        PyMem_Free(seen);
    }
    *sum_out = sum;
    *distinct_out = distinct;
    return 0;
}

/* the gram orders of a tuple of ints, each between 1 and MAX_ORDER, at most 8 */
static Py_ssize_t read_orders(PyObject *orders, Py_ssize_t *order_of)
{
    Py_ssize_t norders = PyTuple_GET_SIZE(orders);
    if (norders > 8) {
        PyErr_SetString(PyExc_ValueError, "at most 8 orders");
        return -1;
    }
    for (Py_ssize_t k = 0; k < norders; k++) {
        Py_ssize_t n = PyLong_AsSsize_t(PyTuple_GET_ITEM(orders, k));
        if (n == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (n < 1 || n > MAX_ORDER) {
            PyErr_SetString(PyExc_ValueError, "orders must be between 1 and 16");
            return -1;
        }
        order_of[k] = n;
    }
    return norders;
}

static PyObject *GramTable_score(GramTable *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyUnicode_Check(args[0]) || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "score(text: str, orders: tuple[int, ...])");
        return NULL;
    }
    if (self->keys == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "gram table not initialised");
        return NULL;
    }
    if (MAKE_READY(args[0]) == -1) {
        return NULL;
    }
    Py_ssize_t order_of[8];
    Py_ssize_t norders = read_orders(args[1], order_of);
    double sum;
    Py_ssize_t distinct;
    if (norders < 0 || gram_score(self, args[0], order_of, norders, &sum, &distinct) < 0) {
        return NULL;
    }
    return Py_BuildValue("(dn)", sum, distinct);
}

static Py_ssize_t GramTable_len(GramTable *self)
{
    return self->size;
}

/* The weights of ``n`` hashed grams in the table: summed in their order, or (``bits``) or-ed as whole
   numbers. */
static inline double hashes_sum(const GramTable *self, const uint64_t *h, Py_ssize_t n)
{
    double sum = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) {
        sum += lookup(self, h[i]);
    }
    return sum;
}

static inline uint64_t hashes_bits(const GramTable *self, const uint64_t *h, Py_ssize_t n)
{
    uint64_t mask = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        mask |= (uint64_t)lookup(self, h[i]);
    }
    return mask;
}

/* The weights of the packed grams in the table: summed, or (``bits``) or-ed as whole numbers. */
static PyObject *packed_lookup(GramTable *self, PyObject *arg, int bits)
{
    if (!PyBytes_Check(arg) || PyBytes_GET_SIZE(arg) % 8 != 0) {
        PyErr_SetString(PyExc_TypeError, "expected the bytes of word_hashes (8 bytes a gram)");
        return NULL;
    }
    const uint64_t *h = (const uint64_t *)PyBytes_AS_STRING(arg); /* 8-byte aligned in CPython */
    Py_ssize_t n = PyBytes_GET_SIZE(arg) / 8;
    return bits ? PyLong_FromUnsignedLongLong(hashes_bits(self, h, n)) : PyFloat_FromDouble(hashes_sum(self, h, n));
}

PyDoc_STRVAR(sum_doc,
             "sum(hashes) -> float\n\n"
             "The summed weights of the grams whose hashes ``word_hashes`` packed (0 for those not in the table).");

static PyObject *GramTable_sum(GramTable *self, PyObject *arg)
{
    return packed_lookup(self, arg, 0);
}

PyDoc_STRVAR(bits_doc,
             "bits(hashes) -> int\n\n"
             "The bitwise or of the weights (whole numbers: one bit a lexicon) of the packed grams in the table.");

static PyObject *GramTable_bits(GramTable *self, PyObject *arg)
{
    return packed_lookup(self, arg, 1);
}

static PyMethodDef GramTable_methods[] = {
    {"score", (PyCFunction)(void (*)(void))GramTable_score, METH_FASTCALL, score_doc},
    {"sum", (PyCFunction)GramTable_sum, METH_O, sum_doc},
    {"bits", (PyCFunction)GramTable_bits, METH_O, bits_doc},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods GramTable_as_sequence = {
    .sq_length = (lenfunc)GramTable_len,
};

PyDoc_STRVAR(GramTable_doc,
             "GramTable(weights: dict[str, float])\n\n"
             "A model namespace's gram -> weight table, keyed by the grams' hashes.");

static PyTypeObject GramTableType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "classifiers._grams.GramTable",
    .tp_basicsize = sizeof(GramTable),
    .tp_dealloc = (destructor)GramTable_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = GramTable_doc,
    .tp_methods = GramTable_methods,
    .tp_as_sequence = &GramTable_as_sequence,
    .tp_init = (initproc)GramTable_init,
    .tp_new = PyType_GenericNew,
};

/* ---- words ----------------------------------------------------------------------------------------
 *
 * ``classifiers.features._tokens`` and ``_ngrams`` in one pass without the regex engine: the tokens of a
 * text are the maximal runs of letters (word characters that are neither decimal digits, ``_`` nor CJK),
 * the maximal runs of decimal digits and every single character that is neither a word character nor
 * white space; a token whose characters are all digits becomes ``#``. The character classes are the
 * ones ``re`` uses for a str pattern (``\w``: ``str.isalnum`` or ``_``; ``\d``: ``str.isdecimal``; ``\s``:
 * ``str.isspace``), so the list is the regex's (``tests/classifiers/test_grams.py`` holds the two to each
 * other on every character class). The set holds the tokens and the pairs of neighbours joined by a space.
 */

enum { SKIP, LETTER, DIGIT, MARK };

static inline int is_cjk(Py_UCS4 c)
{
    return (c >= 0x3040 && c <= 0x30ff) || (c >= 0x3400 && c <= 0x4dbf) || (c >= 0x4e00 && c <= 0x9fff) ||
           (c >= 0xac00 && c <= 0xd7af) || (c >= 0xf900 && c <= 0xfaff);
}

static inline int char_class(Py_UCS4 c)
{
    if (c < 128) {
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
            return LETTER;
        }
        if (c >= '0' && c <= '9') {
            return DIGIT;
        }
        /* ``\s`` on ASCII: space, \t \n \v \f \r and the separators \x1c-\x1f; ``_`` is a word character */
        if (c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f) || c == '_') {
            return SKIP;
        }
        return MARK;
    }
    if (Py_UNICODE_ISDECIMAL(c)) {
        return DIGIT;
    }
    if (Py_UNICODE_ISALNUM(c)) {
        return is_cjk(c) ? SKIP : LETTER;
    }
    return Py_UNICODE_ISSPACE(c) ? SKIP : MARK;
}

typedef struct {
    Py_ssize_t start;
    Py_ssize_t len; /* 1 for "#" */
    int hash;       /* the token is "#" for a run of digits (a literal "#" is a mark: its own text) */
    int alpha;      /* every character a letter (``str.isalpha``) */
    int sharp;      /* the token is "#", either way */
} Token;

/* The token that starts at or after ``*i`` (moved past it); 0 at the end of the text. */
static int next_token(int kind, const void *data, Py_ssize_t len, Py_ssize_t *i, Token *t)
{
    while (*i < len) {
        Py_UCS4 c = PyUnicode_READ(kind, data, *i);
        int cls = char_class(c);
        if (cls == SKIP) {
            (*i)++;
            continue;
        }
        Py_ssize_t start = (*i)++;
        int all_digits = 0, alpha = 0;
        if (cls != MARK) {
            /* a run of one class; a letter run whose every character is a digit (superscripts) is "#"
               too, as ``str.isdigit`` says of it */
            all_digits = cls == DIGIT || Py_UNICODE_ISDIGIT(c);
            alpha = cls == LETTER && Py_UNICODE_ISALPHA(c);
            while (*i < len) {
                Py_UCS4 d = PyUnicode_READ(kind, data, *i);
                if (char_class(d) != cls) {
                    break;
                }
                if (cls == LETTER) {
                    all_digits = all_digits && Py_UNICODE_ISDIGIT(d);
                    alpha = alpha && Py_UNICODE_ISALPHA(d);
                }
                (*i)++;
            }
        }
        t->start = start;
        t->hash = all_digits;
        t->len = all_digits ? 1 : *i - start;
        t->alpha = alpha && !all_digits;
        t->sharp = all_digits || (cls == MARK && c == '#');
        return 1;
    }
    return 0;
}

static PyObject *hash_token; /* "#" */
static PyObject *space;      /* " " */

static PyObject *pair(PyObject *a, PyObject *b)
{
    Py_ssize_t la = PyUnicode_GET_LENGTH(a), lb = PyUnicode_GET_LENGTH(b);
    /* the wider of the two kinds: each part is in its canonical (narrowest) form, so the join is too */
    Py_UCS4 maxchar = PyUnicode_MAX_CHAR_VALUE(a);
    if (PyUnicode_MAX_CHAR_VALUE(b) > maxchar) {
        maxchar = PyUnicode_MAX_CHAR_VALUE(b);
    }
    PyObject *out = PyUnicode_New(la + 1 + lb, maxchar);
    if (out == NULL) {
        return NULL;
    }
    if (PyUnicode_CopyCharacters(out, 0, a, 0, la) < 0 || PyUnicode_CopyCharacters(out, la, space, 0, 1) < 0 ||
        PyUnicode_CopyCharacters(out, la + 1, b, 0, lb) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

PyDoc_STRVAR(word_grams_doc,
             "word_grams(text) -> (tokens, grams)\n\n"
             "The tokens of ``text`` (letter runs, ``#`` for digit runs, single marks) and the set of the "
             "tokens and of each two neighbours joined by a space.");

static PyObject *word_grams(PyObject *module, PyObject *text)
{
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "word_grams(text: str)");
        return NULL;
    }
    if (MAKE_READY(text) == -1) {
        return NULL;
    }
    Py_ssize_t len = PyUnicode_GET_LENGTH(text);
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    PyObject *tokens = PyList_New(0);
    PyObject *grams = PySet_New(NULL);
    PyObject *prev = NULL; /* borrowed from ``tokens`` */
    if (tokens == NULL || grams == NULL) {
        goto fail;
    }
    Py_ssize_t i = 0;
    Token t;
    while (next_token(kind, data, len, &i, &t)) {
        PyObject *token = t.hash ? Py_NewRef(hash_token) : PyUnicode_Substring(text, t.start, t.start + t.len);
        if (token == NULL) {
            goto fail;
        }
        if (PyList_Append(tokens, token) < 0 || PySet_Add(grams, token) < 0) {
            Py_DECREF(token);
            goto fail;
        }
        Py_DECREF(token);
        if (prev != NULL) {
            PyObject *bigram = pair(prev, token);
            if (bigram == NULL || PySet_Add(grams, bigram) < 0) {
                Py_XDECREF(bigram);
                goto fail;
            }
            Py_DECREF(bigram);
        }
        prev = token; /* alive in ``tokens`` */
    }
    PyObject *out = PyTuple_Pack(2, tokens, grams);
    Py_DECREF(tokens);
    Py_DECREF(grams);
    return out;
fail:
    Py_XDECREF(tokens);
    Py_XDECREF(grams);
    return NULL;
}

/* The same tokens hashed as ``gram_hash`` hashes the string of a gram (its length, then its code points; a
 * digit run is the string "#"), so that a table of the model's word grams answers for them without a
 * Python string, set or dict per gram. */

static inline uint64_t fnv_token(uint64_t h, int kind, const void *data, const Token *t)
{
    if (t->hash) {
        return (h ^ (uint64_t)'#') * FNV_PRIME;
    }
    for (Py_ssize_t j = 0; j < t->len; j++) {
        h = (h ^ (uint64_t)PyUnicode_READ(kind, data, t->start + j)) * FNV_PRIME;
    }
    return h;
}

static void add_hash(uint64_t h, uint64_t *seen, size_t mask, uint64_t *out, Py_ssize_t *n)
{
    size_t s = (size_t)h & mask;
    while (seen[s] != 0 && seen[s] != h) {
        s = (s + 1) & mask;
    }
    if (seen[s] == 0) {
        seen[s] = h;
        out[(*n)++] = h;
    }
}

PyDoc_STRVAR(word_hashes_doc,
             "word_hashes(text, bigrams) -> (hashes, tokens, marks, first)\n\n"
             "The distinct word grams of ``text`` (its tokens, and with ``bigrams`` each two neighbours joined "
             "by a space) as packed 8-byte hashes for ``GramTable.sum`` and ``GramTable.bits``; how many "
             "tokens there are and how many of them are ``#``; and the first two of the first six tokens "
             "that are all letters (``str.isalpha``).");

/* The distinct word grams of a text as hashes, in the order they first appear, with its counts. */
typedef struct {
    uint64_t *hashes; /* PyMem_Malloc'ed: ``n`` of them */
    Py_ssize_t n, tokens, marks, nfirst;
    Py_ssize_t first_start[2], first_len[2]; /* the first two all-letter tokens of the first six */
} Words;

static int hash_words(PyObject *text, int bigrams, Words *w)
{
    Py_ssize_t len = PyUnicode_GET_LENGTH(text);
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    w->hashes = NULL;
    w->n = w->tokens = w->marks = w->nfirst = 0;
    Token *tokens = PyMem_Malloc(sizeof(Token) * (size_t)(len + 1));
    if (tokens == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t ntok = 0;
    Py_ssize_t i = 0;
    while (next_token(kind, data, len, &i, &tokens[ntok])) {
        w->marks += tokens[ntok].sharp;
        if (tokens[ntok].alpha && w->nfirst < 2 && ntok < 6) {
            w->first_start[w->nfirst] = tokens[ntok].start;
            w->first_len[w->nfirst++] = tokens[ntok].len;
        }
        ntok++;
    }
    w->tokens = ntok;
    Py_ssize_t most = bigrams && ntok > 0 ? 2 * ntok - 1 : ntok;
    size_t slots = slots_for(most);
    uint64_t *seen = PyMem_Calloc(slots, sizeof(uint64_t));
    w->hashes = PyMem_Malloc(sizeof(uint64_t) * (size_t)(most > 0 ? most : 1));
    if (seen == NULL || w->hashes == NULL) {
        PyMem_Free(tokens);
        PyMem_Free(seen);
        PyMem_Free(w->hashes);
        w->hashes = NULL;
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t n = 0;
    for (Py_ssize_t k = 0; k < ntok; k++) {
        const Token *a = &tokens[k];
        add_hash(finish(fnv_token(FNV_OFFSET ^ (uint64_t)a->len, kind, data, a)), seen, slots - 1, w->hashes, &n);
        if (bigrams && k > 0) {
            const Token *p = &tokens[k - 1];
            uint64_t h = FNV_OFFSET ^ (uint64_t)(p->len + 1 + a->len);
            h = fnv_token(h, kind, data, p);
            h = (h ^ (uint64_t)' ') * FNV_PRIME;
            h = fnv_token(h, kind, data, a);
            add_hash(finish(h), seen, slots - 1, w->hashes, &n);
        }
    }
    w->n = n;
    PyMem_Free(tokens);
    PyMem_Free(seen);
    return 0;
}

static PyObject *word_hashes(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyUnicode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "word_hashes(text: str, bigrams: bool)");
        return NULL;
    }
    PyObject *text = args[0];
    int bigrams = PyObject_IsTrue(args[1]);
    if (bigrams < 0 || MAKE_READY(text) == -1) {
        return NULL;
    }
    Words w;
    if (hash_words(text, bigrams, &w) < 0) {
        return NULL;
    }
    PyObject *packed = PyBytes_FromStringAndSize((const char *)w.hashes, 8 * w.n);
    PyObject *first = PyTuple_New(w.nfirst);
    PyMem_Free(w.hashes);
    if (packed == NULL || first == NULL) {
        Py_XDECREF(packed);
        Py_XDECREF(first);
        return NULL;
    }
    for (Py_ssize_t f = 0; f < w.nfirst; f++) {
        PyObject *word = PyUnicode_Substring(text, w.first_start[f], w.first_start[f] + w.first_len[f]);
        if (word == NULL) {
            Py_DECREF(packed);
            Py_DECREF(first);
            return NULL;
        }
        PyTuple_SET_ITEM(first, f, word);
    }
    return Py_BuildValue("(NnnN)", packed, w.tokens, w.marks, first);
}

/* ---- structural cues ---------------------------------------------------------------------------------
 *
 * ``classifiers.features._dense`` in one pass over the scanned window, without a Python object per line,
 * count or match: the same dict, key for key and float for float (``tests/classifiers/test_grams_dense.py``
 * holds the two to each other). The regexes of ``features`` (``_KV_LINE``, ``_BULLET``, ``_SPEAKER``,
 * ``_NUMSEQ``) are matched by hand: each is deterministic once its character classes are read as ``re``
 * reads them for a str pattern (``\s``: ``str.isspace``, ``\w``: ``str.isalnum`` or ``_``, ``\d``:
 * ``str.isdecimal``; under IGNORECASE a letter matches a character whose simple lower case is that letter,
 * or for ``i`` and ``s`` the dotless i and the long s, as ``re._casefix`` adds), so a greedy reading finds
 * what the regex finds. ``str.strip`` and ``str.split("\n")`` are read the same way: white space is
 * ``str.isspace``, lines end at ``\n`` only.
 */

#define N_BASE 23
#define N_LAYOUT 6
#define CHAR_HEAD 120
#define CHAR_TAIL 160
#define HEAD_NS 160
#define TAIL_NS 240

typedef struct {
    int kind;
    const void *data;
    Py_ssize_t len;
} Text;

#define AT(t, i) PyUnicode_READ((t)->kind, (t)->data, (i))

static inline int is_space(Py_UCS4 c)
{
    return Py_UNICODE_ISSPACE(c);
}

static inline int is_decimal(Py_UCS4 c)
{
    return c < 128 ? (c >= '0' && c <= '9') : Py_UNICODE_ISDECIMAL(c);
}

static inline Py_ssize_t skip_space(const Text *t, Py_ssize_t i)
{
    while (i < t->len && is_space(AT(t, i))) {
        i++;
    }
    return i;
}

/* ``^\s*[-\w.\[\]]{1,40}\s*[:=]\s*\S`` at ``p``: the end of the match, or -1 */
static Py_ssize_t match_kv(const Text *t, Py_ssize_t p)
{
    Py_ssize_t i = skip_space(t, p), j = i;
    while (j < t->len && j - i <= 40) {
        Py_UCS4 c = AT(t, j);
        if (!(c == '-' || c == '.' || c == '[' || c == ']' || c == '_' || Py_UNICODE_ISALNUM(c))) {
            break;
        }
        j++;
    }
    if (j == i || j - i > 40) {
        return -1;
    }
    j = skip_space(t, j);
    if (j >= t->len || (AT(t, j) != ':' && AT(t, j) != '=')) {
        return -1;
    }
    j = skip_space(t, j + 1);
    return j < t->len ? j + 1 : -1;
}

/* ``^\s*(?:[-*•]|\d{1,3}[.)])\s+\S`` at ``p`` */
static Py_ssize_t match_bullet(const Text *t, Py_ssize_t p)
{
    Py_ssize_t i = skip_space(t, p), j = i;
    if (i >= t->len) {
        return -1;
    }
    Py_UCS4 c = AT(t, i);
    if (c == '-' || c == '*' || c == 0x2022) {
        j = i + 1;
    }
    else {
        while (j < t->len && j - i <= 3 && is_decimal(AT(t, j))) {
            j++;
        }
        if (j == i || j - i > 3 || j >= t->len || (AT(t, j) != '.' && AT(t, j) != ')')) {
            return -1;
        }
        j++;
    }
    if (j >= t->len || !is_space(AT(t, j))) {
        return -1;
    }
    j = skip_space(t, j);
    return j < t->len ? j + 1 : -1;
}

/* a letter of a pattern compiled with IGNORECASE: ``re`` compares the simple lower case of the character,
   and for "i" and "s" also takes the dotless i and the long s (``re._casefix``) */
static inline int letter_matches(Py_UCS4 c, Py_UCS4 letter)
{
    Py_UCS4 lo = Py_UNICODE_TOLOWER(c);
    return lo == letter || (letter == 'i' && lo == 0x131) || (letter == 's' && lo == 0x17f);
}

static const char *const speaker_words[] = {"human", "user",  "assistant", "system", "ai", "bot", "customer",
                                            "agent", "me",    "you",       "q",      "a",  NULL};
static const Py_UCS4 speaker_cjk[][2] = {{0x7528, 0x6237}, {0x52a9, 0x624b}}; /* 用户, 助手 */

/* ``^\s*(?:human|user|...|a|用户|助手)\s*[:：]`` with IGNORECASE at ``p``: the alternatives in order, each
   followed by the rest of the pattern (a word that is a prefix of another is followed by a letter where
   the other matches, which the rest refuses, so the first that matches is the only one) */
static Py_ssize_t match_speaker(const Text *t, Py_ssize_t p)
{
    Py_ssize_t i = skip_space(t, p);
    for (int w = 0; w < 14; w++) {
        Py_ssize_t j = i;
        int ok = 1;
        if (w < 12) {
            for (const char *s = speaker_words[w]; *s; s++, j++) {
                if (j >= t->len || !letter_matches(AT(t, j), (Py_UCS4)*s)) {
                    ok = 0;
                    break;
                }
            }
        }
        else {
            for (int k = 0; k < 2; k++, j++) {
                if (j >= t->len || AT(t, j) != speaker_cjk[w - 12][k]) {
                    ok = 0;
                    break;
                }
            }
        }
        if (!ok) {
            continue;
        }
        j = skip_space(t, j);
        if (j < t->len && (AT(t, j) == ':' || AT(t, j) == 0xff1a)) {
            return j + 1;
        }
    }
    return -1;
}

/* ``len(pattern.findall(text))`` for a pattern that starts with ``^`` under MULTILINE: tried at the start
   and after each "\n", from the end of the previous match on */
static Py_ssize_t count_at_line_starts(const Text *t, Py_ssize_t (*match)(const Text *, Py_ssize_t))
{
    Py_ssize_t count = 0, p = 0;
    while (p < t->len) {
        if (p == 0 || AT(t, p - 1) == '\n') {
            Py_ssize_t end = match(t, p);
            if (end >= 0) {
                count++;
                p = end;
                continue;
            }
        }
        p++;
    }
    return count;
}

/* the end of ``\d+(?:\.\d+)?`` from the digit at ``i`` (maximal runs: a shorter one leaves a digit where the
   rest of ``_NUMSEQ`` needs a separator) */
static Py_ssize_t number_end(const Py_UCS4 *s, Py_ssize_t n, Py_ssize_t i)
{
    while (i < n && is_decimal(s[i])) {
        i++;
    }
    if (i + 1 < n && s[i] == '.' && is_decimal(s[i + 1])) {
        i++;
        while (i < n && is_decimal(s[i])) {
            i++;
        }
    }
    return i;
}

/* ``_NUMSEQ.search(s) is not None``: ``\d+(?:\.\d+)?(?:\s*[,;]\s*-?\d+(?:\.\d+)?){3,}`` somewhere. Each
   part is read greedily (a shorter reading leaves a character the next part refuses), so a match exists
   where one starts at the start of a run of digits and reads three separated numbers after the first. */
static int has_number_sequence(const Py_UCS4 *s, Py_ssize_t n)
{
    for (Py_ssize_t start = 0; start < n; start++) {
        if (!is_decimal(s[start]) || (start > 0 && is_decimal(s[start - 1]))) {
            continue;
        }
        Py_ssize_t j = number_end(s, n, start);
        for (int reps = 0;; reps++) {
            if (reps >= 3) {
                return 1;
            }
            Py_ssize_t k = j;
            while (k < n && is_space(s[k])) {
                k++;
            }
            if (k >= n || (s[k] != ',' && s[k] != ';')) {
                break;
            }
            k++;
            while (k < n && is_space(s[k])) {
                k++;
            }
            if (k < n && s[k] == '-') {
                k++;
            }
            if (k >= n || !is_decimal(s[k])) {
                break;
            }
            j = number_end(s, n, k);
        }
    }
    return 0;
}

/* the stripped extent of ``t[start:end]`` (``str.strip``) */
static void strip_range(const Text *t, Py_ssize_t *start, Py_ssize_t *end)
{
    while (*start < *end && is_space(AT(t, *start))) {
        (*start)++;
    }
    while (*end > *start && is_space(AT(t, *end - 1))) {
        (*end)--;
    }
}

typedef struct {
    Py_ssize_t start, end; /* the line, stripped */
    uint64_t hash;
    Py_ssize_t count; /* lines like it so far: in the table's slots only */
} Line;

static int same_line(const Text *t, const Line *a, const Line *b)
{
    Py_ssize_t n = a->end - a->start;
    if (n != b->end - b->start) {
        return 0;
    }
    return memcmp((const char *)t->data + a->start * t->kind, (const char *)t->data + b->start * t->kind,
                  (size_t)n * (size_t)t->kind) == 0;
}

static inline int ends_with_question(Py_UCS4 c)
{
    /* ``_QUESTION_ENDS``: Latin, CJK, Arabic, Greek (";" and U+037E) and Devanagari question marks */
    return c == '?' || c == 0xff1f || c == 0x061f || c == ';' || c == 0x037e || c == 0x0964;
}

typedef struct {
    PyObject_HEAD
    PyObject *names; /* tuple: N_BASE base names, N_LAYOUT layout names, then the cue and context names */
    Py_ssize_t n_cues, n_context;
} DenseReader;

static void DenseReader_dealloc(DenseReader *self)
{
    Py_XDECREF(self->names);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int DenseReader_init(DenseReader *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"base", "layout", "cues", "context", NULL};
    PyObject *parts[4];
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!O!O!", kwlist, &PyTuple_Type, &parts[0], &PyTuple_Type,
                                     &parts[1], &PyTuple_Type, &parts[2], &PyTuple_Type, &parts[3])) {
        return -1;
    }
    if (PyTuple_GET_SIZE(parts[0]) != N_BASE || PyTuple_GET_SIZE(parts[1]) != N_LAYOUT) {
        PyErr_Format(PyExc_ValueError, "expected %d base and %d layout names", N_BASE, N_LAYOUT);
        return -1;
    }
    PyObject *names = PyTuple_New(N_BASE + N_LAYOUT + PyTuple_GET_SIZE(parts[2]) + PyTuple_GET_SIZE(parts[3]));
    if (names == NULL) {
        return -1;
    }
    Py_ssize_t at = 0;
    for (int p = 0; p < 4; p++) {
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(parts[p]); k++) {
            PyObject *name = PyTuple_GET_ITEM(parts[p], k);
            if (!PyUnicode_CheckExact(name)) {
                Py_DECREF(names);
                PyErr_SetString(PyExc_TypeError, "names must be str");
                return -1;
            }
            PyTuple_SET_ITEM(names, at++, Py_NewRef(name));
        }
    }
    Py_XSETREF(self->names, names);
    self->n_cues = PyTuple_GET_SIZE(parts[2]);
    self->n_context = PyTuple_GET_SIZE(parts[3]);
    return 0;
}

static int set_value(PyObject *out, PyObject *name, double value)
{
    PyObject *v = PyFloat_FromDouble(value);
    if (v == NULL) {
        return -1;
    }
    int rc = PyDict_SetItem(out, name, v);
    Py_DECREF(v);
    return rc;
}

/* the values of a tuple of cue floats under their names */
static int set_flags(PyObject *out, PyObject *names, Py_ssize_t at, PyObject *values, Py_ssize_t n)
{
    if (!PyTuple_Check(values) || PyTuple_GET_SIZE(values) != n) {
        PyErr_Format(PyExc_ValueError, "expected a tuple of %zd cue values", n);
        return -1;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        if (PyDict_SetItem(out, PyTuple_GET_ITEM(names, at + k), PyTuple_GET_ITEM(values, k)) < 0) {
            return -1;
        }
    }
    return 0;
}

PyDoc_STRVAR(read_doc,
             "read(text, scanned, n_tokens, hashes, code_kw, cues, context_cues, turns, has_system, "
             "context_len) -> dict\n\n"
             "The structural cues of ``features._dense``: the same keys in the same order, the same floats.");

/* The dense cues of ``features._dense``: the 23 base values in ``DENSE_BASE``'s order and which of the 6
   layout cues are set (1) in ``DENSE_LAYOUT``'s order; -1 with the exception the Python would raise. */
static int dense_values(PyObject *text_obj, PyObject *scanned_obj, Py_ssize_t n_tokens, Py_ssize_t hashes,
                        Py_ssize_t code_kw, Py_ssize_t turns, int has_system, Py_ssize_t context_len,
                        double *base, int *layout)
{
    if (MAKE_READY(text_obj) == -1 || MAKE_READY(scanned_obj) == -1) {
        return -1;
    }
    /* math.log1p refuses -1 and below, as for a view of no messages */
    if (turns < 1 || code_kw < 0) {
        PyErr_SetString(PyExc_ValueError, "math domain error");
        return -1;
    }
    Text text = {PyUnicode_KIND(text_obj), PyUnicode_DATA(text_obj), PyUnicode_GET_LENGTH(text_obj)};
    Text sc = {PyUnicode_KIND(scanned_obj), PyUnicode_DATA(scanned_obj), PyUnicode_GET_LENGTH(scanned_obj)};
    const Text *s = &sc;

    /* one pass over the window: its counts, its UTF-8 size, its lines */
    Py_ssize_t symbols = 0, questions = 0, json_keys = 0, indent = 0, paragraphs = 0, utf8 = 0;
    int fence = 0, colon = 0, equals = 0, bullet_mark = 0, surrogate = 0, multiline = 0;
    Py_ssize_t n_lines = 1;
    for (Py_ssize_t i = 0; i < s->len; i++) {
        Py_UCS4 c = AT(s, i);
        if (c < 128) {
            utf8 += 1;
            switch (c) {
            case '{': case '}': case '[': case ']': case '(': case ')': case ';': case '=': case '<':
            case '>': case '|': case '$': case '\\': case '`':
                symbols++;
                break;
            default:
                break;
            }
            switch (c) {
            case '?':
                questions++;
                break;
            case ':':
                colon = 1;
                break;
            case '=':
                equals = 1;
                break;
            case '-': case '*':
                bullet_mark = 1;
                break;
            case '`':
                fence = fence || (i + 2 < s->len && AT(s, i + 1) == '`' && AT(s, i + 2) == '`');
                break;
            case '"': case '\'':
                json_keys += i + 1 < s->len && AT(s, i + 1) == ':';
                break;
            case '\n':
                multiline = 1;
                n_lines++;
                if (i + 1 < s->len) {
                    Py_UCS4 d = AT(s, i + 1);
                    indent += d == '\t' || (d == ' ' && i + 4 < s->len && AT(s, i + 2) == ' ' &&
                                            AT(s, i + 3) == ' ' && AT(s, i + 4) == ' ');
                }
                break;
            default:
                break;
            }
        }
        else {
            utf8 += c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
            surrogate = surrogate || (c >= 0xd800 && c <= 0xdfff);
            questions += c == 0xff1f;
            colon = colon || c == 0xff1a;
            bullet_mark = bullet_mark || c == 0x2022;
        }
    }
    if (surrogate) {
        /* ``scanned.encode()`` refuses a lone surrogate: the same error */
        PyObject *encoded = PyUnicode_AsUTF8String(scanned_obj);
        Py_XDECREF(encoded);
        if (encoded == NULL) {
            return -1;
        }
    }
    for (Py_ssize_t i = 0; i + 1 < s->len; i++) { /* "\n\n" counted without overlaps, as str.count does */
        if (AT(s, i) == '\n' && AT(s, i + 1) == '\n') {
            paragraphs++;
            i++;
        }
    }

    /* the stripped, non-empty lines: how many, how many distinct, the most repeated, the tabular ones */
    Line stack_lines[256], stack_slots[512];
    Line *lines = stack_lines, *slots = stack_slots;
    size_t n_slots = slots_for(n_lines);
    if (n_lines > 256 || n_slots > 512) {
        lines = PyMem_Malloc(sizeof(Line) * (size_t)n_lines);
        slots = PyMem_Calloc(n_slots, sizeof(Line));
        if (lines == NULL || slots == NULL) {
            PyMem_Free(lines);
            PyMem_Free(slots);
            PyErr_NoMemory();
            return -1;
        }
    }
    else {
        memset(stack_slots, 0, sizeof(Line) * n_slots);
    }
    Py_ssize_t nonempty = 0, distinct = 0, max_rep = 0, tabular = 0;
    for (Py_ssize_t start = 0; start <= s->len;) {
        Py_ssize_t end = start;
        while (end < s->len && AT(s, end) != '\n') {
            end++;
        }
        Py_ssize_t a = start, b = end;
        start = end + 1;
        strip_range(s, &a, &b);
        if (a == b) {
            continue;
        }
        Line line = {a, b, FNV_OFFSET ^ (uint64_t)(b - a), 0};
        Py_ssize_t commas = 0, bars = 0, tabs = 0;
        for (Py_ssize_t i = a; i < b; i++) {
            Py_UCS4 c = AT(s, i);
            line.hash = (line.hash ^ (uint64_t)c) * FNV_PRIME;
            commas += c == ',';
            bars += c == '|';
            tabs += c == '\t';
        }
        line.hash = finish(line.hash);
        tabular += commas >= 2 || bars >= 2 || tabs >= 2;
        lines[nonempty++] = line;
        size_t k = (size_t)line.hash & (n_slots - 1);
        while (slots[k].count != 0 && !(slots[k].hash == line.hash && same_line(s, &slots[k], &line))) {
            k = (k + 1) & (n_slots - 1);
        }
        if (slots[k].count == 0) {
            slots[k] = line;
            distinct++;
        }
        slots[k].count++;
        if (slots[k].count > max_rep) {
            max_rep = slots[k].count;
        }
    }
    if (lines != stack_lines) {
        PyMem_Free(lines);
        PyMem_Free(slots);
    }
    Py_ssize_t nl = nonempty > 1 ? nonempty : 1;

    /* the text without its trailing white space */
    Py_ssize_t end = text.len;
    while (end > 0 && is_space(AT(&text, end - 1))) {
        end--;
    }
    Py_UCS4 last_char = end > 0 ? AT(&text, end - 1) : 0;

    double numseq = 0.0;
    if (hashes) {
        /* ``text[:HEAD_NS] + "\n" + text[-TAIL_NS:]`` */
        Py_UCS4 instruction[HEAD_NS + 1 + TAIL_NS];
        Py_ssize_t n = 0, separators = 0;
        Py_ssize_t head = text.len < HEAD_NS ? text.len : HEAD_NS;
        Py_ssize_t tail = text.len < TAIL_NS ? text.len : TAIL_NS;
        for (Py_ssize_t i = 0; i < head; i++) {
            instruction[n++] = AT(&text, i);
        }
        instruction[n++] = '\n';
        for (Py_ssize_t i = text.len - tail; i < text.len; i++) {
            instruction[n++] = AT(&text, i);
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            separators += instruction[i] == ',' || instruction[i] == ';';
        }
        if (separators >= 3 && has_number_sequence(instruction, n)) {
            numseq = 1.0;
        }
    }
    double non_ascii = 0.0;
    if (utf8 != s->len) { /* ``scanned[:600]`` is the whole window: at most HEAD + TAIL + 1 characters */
        Py_ssize_t head = s->len < 600 ? s->len : 600;
        Py_ssize_t size = utf8;
        if (head < s->len) {
            size = 0;
            for (Py_ssize_t i = 0; i < head; i++) {
                Py_UCS4 c = AT(s, i);
                size += c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
            }
        }
        if (size != head) {
            double x = (double)(size - head) / (double)(2 * (head > 1 ? head : 1));
            non_ascii = x < 1.0 ? x : 1.0;
        }
    }
    Py_ssize_t n = s->len > 1 ? s->len : 1;
    double symbols_v = 0.0, digits_v = 0.0;
    if (symbols) {
        double x = 12.0 * (double)symbols / (double)n;
        symbols_v = x < 1.0 ? x : 1.0;
    }
    if (hashes) {
        double x = 3.0 * (double)hashes / (double)(n_tokens > 1 ? n_tokens : 1);
        digits_v = x < 1.0 ? x : 1.0;
    }
    double values[N_BASE] = {
        log1p((double)text.len) / 9.0,
        log1p((double)nonempty) / 5.0,
        (double)(nonempty - distinct) / (double)nl,
        max_rep > 1 ? log1p((double)(max_rep - 1)) / 3.0 : 0.0,
        fence ? 1.0 : 0.0,
        symbols_v,
        multiline ? (double)indent / (double)nl : 0.0,
        colon ? log1p((double)json_keys) / 3.0 : 0.0,
        colon || equals ? (double)count_at_line_starts(s, match_kv) / (double)nl : 0.0,
        hashes || bullet_mark ? (double)count_at_line_starts(s, match_bullet) / (double)nl : 0.0,
        (double)tabular / (double)nl,
        digits_v,
        numseq,
        log1p((double)code_kw) / 2.5,
        last_char == '?' || last_char == 0xff1f ? 1.0 : 0.0,
        questions ? log1p((double)questions) / 2.5 : 0.0,
        colon ? log1p((double)count_at_line_starts(s, match_speaker)) / 2.5 : 0.0,
        multiline ? log1p((double)paragraphs) / 3.0 : 0.0,
        non_ascii,
        log1p((double)(turns - 1)) / 3.0,
        has_system ? 1.0 : 0.0,
        context_len ? log1p((double)context_len) / 9.0 : 0.0,
        end == 0 ? 1.0 : 0.0,
    };
    memcpy(base, values, sizeof(values));
    memset(layout, 0, sizeof(int) * N_LAYOUT);
    if (multiline && end > CHAR_HEAD + CHAR_TAIL) {
        /* ``_layout``: a short last or first line around the pasted material, and how it ends */
        Py_ssize_t cut = PyUnicode_FindChar(text_obj, '\n', 0, end, 1);
        if (cut == -2) {
            return -1;
        }
        if (cut >= 0) {
            Py_ssize_t from = PyUnicode_FindChar(text_obj, '\n', 0, end, -1);
            if (from == -2) {
                return -1;
            }
            Py_ssize_t ranges[2][2] = {{from + 1, end}, {0, cut}}; /* the last line, then the first */
            for (int r = 0; r < 2; r++) {
                Py_ssize_t a = ranges[r][0], b = ranges[r][1];
                strip_range(&text, &a, &b);
                if (b - a < 1 || b - a > 300) {
                    continue;
                }
                Py_UCS4 c = AT(&text, b - 1);
                layout[3 * r] = 1;
                if (ends_with_question(c) || c == ':' || c == 0xff1a) {
                    layout[3 * r + (ends_with_question(c) ? 1 : 2)] = 1;
                }
            }
        }
    }
    return 0;
}

static PyObject *DenseReader_read(DenseReader *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10 || !PyUnicode_Check(args[0]) || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "read(text: str, scanned: str, n_tokens: int, hashes: int, code_kw: int, cues: tuple, "
                        "context_cues: tuple | None, turns: int, has_system: bool, context_len: int)");
        return NULL;
    }
    if (self->names == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "dense reader not initialised");
        return NULL;
    }
    PyObject *text_obj = args[0], *scanned_obj = args[1];
    Py_ssize_t n_tokens = PyLong_AsSsize_t(args[2]);
    Py_ssize_t hashes = n_tokens == -1 && PyErr_Occurred() ? -1 : PyLong_AsSsize_t(args[3]);
    Py_ssize_t code_kw = hashes == -1 && PyErr_Occurred() ? -1 : PyLong_AsSsize_t(args[4]);
    Py_ssize_t turns = code_kw == -1 && PyErr_Occurred() ? -1 : PyLong_AsSsize_t(args[7]);
    int has_system = turns == -1 && PyErr_Occurred() ? -1 : PyObject_IsTrue(args[8]);
    Py_ssize_t context_len = has_system < 0 ? -1 : PyLong_AsSsize_t(args[9]);
    if (context_len == -1 && PyErr_Occurred()) {
        return NULL;
    }
    double base[N_BASE];
    int layout[N_LAYOUT];
    if (dense_values(text_obj, scanned_obj, n_tokens, hashes, code_kw, turns, has_system, context_len, base,
                     layout) < 0) {
        return NULL;
    }
    PyObject *out = PyDict_New();
    if (out == NULL) {
        return NULL;
    }
    for (int k = 0; k < N_BASE; k++) {
        if (set_value(out, PyTuple_GET_ITEM(self->names, k), base[k]) < 0) {
            goto fail;
        }
    }
    for (int k = 0; k < N_LAYOUT; k++) {
        if (layout[k] && set_value(out, PyTuple_GET_ITEM(self->names, N_BASE + k), 1.0) < 0) {
            goto fail;
        }
    }
    if (set_flags(out, self->names, N_BASE + N_LAYOUT, args[5], self->n_cues) < 0) {
        goto fail;
    }
    if (args[6] != Py_None &&
        set_flags(out, self->names, N_BASE + N_LAYOUT + self->n_cues, args[6], self->n_context) < 0) {
        goto fail;
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef DenseReader_methods[] = {
    {"read", (PyCFunction)(void (*)(void))DenseReader_read, METH_FASTCALL, read_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(DenseReader_doc,
             "DenseReader(base, layout, cues, context)\n\n"
             "The structural cues of a prompt under these names: 23 base cues, the 6 layout cues, then the cue "
             "lexicons' and the chat context's lexicons' names.");

static PyTypeObject DenseReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "classifiers._grams.DenseReader",
    .tp_basicsize = sizeof(DenseReader),
    .tp_dealloc = (destructor)DenseReader_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = DenseReader_doc,
    .tp_methods = DenseReader_methods,
    .tp_init = (initproc)DenseReader_init,
    .tp_new = PyType_GenericNew,
};

/* ---- the dense cues' weighted sum ------------------------------------------------------------------- */

PyDoc_STRVAR(weighted_sum_doc,
             "weighted_sum(weights, values) -> float\n\n"
             "``sum(map(mul, map(weights.get, values, repeat(0.0)), values.values()))`` for dicts of floats: "
             "the same products added in the same order, as the running interpreter's ``sum`` adds them. "
             "TypeError where a weight or a value is not a float.");

static PyObject *weighted_sum(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyDict_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "weighted_sum(weights: dict, values: dict)");
        return NULL;
    }
    PyObject *weights = args[0], *values = args[1];
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    double total = 0.0;
#if PY_VERSION_HEX >= 0x030C0000
    /* from 3.12 ``sum`` adds floats with Neumaier's compensation, the first one plainly (``0 + x``) */
    double compensation = 0.0;
    int first = 1;
#endif
    while (PyDict_Next(values, &pos, &key, &value)) {
        PyObject *w = PyDict_GetItemWithError(weights, key); /* borrowed */
        if (w == NULL && PyErr_Occurred()) {
            return NULL;
        }
        if (!PyFloat_CheckExact(value) || (w != NULL && !PyFloat_CheckExact(w))) {
            PyErr_SetString(PyExc_TypeError, "weighted_sum adds floats only");
            return NULL;
        }
        double x = (w == NULL ? 0.0 : PyFloat_AS_DOUBLE(w)) * PyFloat_AS_DOUBLE(value);
#if PY_VERSION_HEX >= 0x030C0000
        if (first) {
            total = 0.0 + x;
            first = 0;
            continue;
        }
        double t = total + x;
        if (fabs(total) >= fabs(x)) {
            compensation += (total - t) + x;
        }
        else {
            compensation += (x - t) + total;
        }
        total = t;
#else
        total += x;
#endif
    }
#if PY_VERSION_HEX >= 0x030C0000
    if (compensation != 0.0 && isfinite(compensation)) {
        total += compensation;
    }
#endif
    return PyFloat_FromDouble(total);
}

/* ---- the character windows' normal form ------------------------------------------------------------
 *
 * ``features._norm_py``: lower case (``str.lower``, its full mapping: a character may lower to two), the
 * ASCII digits 1-9 folded to 0, white space runs (``str.isspace``) to one space and none at the ends. An
 * ASCII text is lowered here; any other goes through ``str.lower`` itself, then one pass folds and joins. */

static PyObject *lower_name; /* "lower" */

PyDoc_STRVAR(norm_doc,
             "norm(text) -> str\n\n"
             "``text`` lower-cased, the ASCII digits 1-9 folded to 0, white space runs to one space, stripped: "
             "``\" \".join(re.sub(\"[1-9]\", \"0\", text.lower()).split())``.");

static PyObject *norm(PyObject *module, PyObject *text)
{
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "norm(text: str)");
        return NULL;
    }
    if (MAKE_READY(text) == -1) {
        return NULL;
    }
    int ascii = PyUnicode_IS_ASCII(text);
    PyObject *low = ascii ? Py_NewRef(text) : PyObject_CallMethodNoArgs(text, lower_name);
    if (low == NULL) {
        return NULL;
    }
    if (!PyUnicode_Check(low) || MAKE_READY(low) == -1) {
        Py_DECREF(low);
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "str.lower gave no str");
        }
        return NULL;
    }
    Text t = {PyUnicode_KIND(low), PyUnicode_DATA(low), PyUnicode_GET_LENGTH(low)};
    /* the first pass sizes the result (its length and widest character, for a str in its canonical form),
       the second writes it */
    Py_ssize_t n = 0;
    Py_UCS4 maxchar = 0;
    PyObject *out = NULL;
    for (int pass = 0; pass < 2; pass++) {
        void *dst = out == NULL ? NULL : PyUnicode_DATA(out);
        int dst_kind = out == NULL ? 0 : PyUnicode_KIND(out);
        Py_ssize_t at = 0;
        int gap = 0;
        for (Py_ssize_t i = 0; i < t.len; i++) {
            Py_UCS4 c = AT(&t, i);
            if (ascii && c >= 'A' && c <= 'Z') {
                c += 'a' - 'A';
            }
            else if (c >= '1' && c <= '9') {
                c = '0';
            }
            if (is_space(c)) {
                gap = at > 0;
                continue;
            }
            if (gap) {
                if (dst != NULL) {
                    PyUnicode_WRITE(dst_kind, dst, at, ' ');
                }
                at++;
                gap = 0;
            }
            if (dst != NULL) {
                PyUnicode_WRITE(dst_kind, dst, at, c);
            }
            else if (c > maxchar) {
                maxchar = c;
            }
            at++;
        }
        if (pass == 0) {
            n = at;
            if (n > 0 && maxchar < ' ') {
                maxchar = ' ';
            }
            out = PyUnicode_New(n, maxchar);
            if (out == NULL || n == 0) {
                break;
            }
        }
    }
    Py_DECREF(low);
    return out;
}

/* ---- the whole prediction ---------------------------------------------------------------------------
 *
 * ``Classifier.predict`` after the request's view: the windows sliced and lower-cased, the last segment found
 * as ``features.last_segment`` finds it, the words hashed and looked up, the cue lexicons' bits, the
 * character windows normalised and counted, the structural cues, the score summed in ``Classifier.score``'s
 * order (the bias, then the character namespaces' share, the word namespaces' share, the first words, the
 * dense cues' weighted sum), the calibration table, the request fields' shift, the sigmoid, the label and
 * the kind (``kinds.kind_of``). Every operation is the one the Python does, in its order, with its one
 * rounding (``tests/classifiers/test_grams_scorer.py`` holds the two to each other bit for bit).
 *
 * A scanned window that holds a character from U+3040 on is read by ``features.extract`` with Python sets
 * (its cues also read the CJK characters and character pairs of the instruction windows, ``_cjk_grams``), and
 * ``Classifier.score`` then adds each word namespace's share on its own, its weights summed in the order the
 * set holds its grams. The scorer does the same for such a window: the CJK grams' hashes are looked up in the
 * cue table like the words', and the word namespaces' grams are built as the same Python sets (the same
 * strings added in the same order, so the same iteration order) and summed in that order, each share added
 * to the score in turn; the rest is the hashed reading above. */

#define LAST_MAX 300
#define LAST_MIN_TEXT (CHAR_HEAD + CHAR_TAIL)
#define CHAR_BODY 64
#define CHAR_CONTEXT 300
#define CONTEXT_HEAD_NS 300
#define CONTEXT_WINDOW 600
#define WINDOW_HEAD 250
#define WINDOW_TAIL 300
#define N_KIND_CUES 9
#define CJK_MAX 800

enum { NS_CH, NS_CT, NS_CB, NS_CX }; /* ``features.CHAR_ORDERS`` */
enum { NS_WH, NS_WT, NS_WL, NS_X }; /* ``features.HASHED_NAMESPACES`` */
enum { K_REPEAT, K_CODE, K_FORMAT, K_CONFIG, K_TEMPLATE, K_EXTRACT, K_REWRITE, K_MATH, K_CREATIVE };
enum {
    KIND_TOOLS, KIND_REPETITION, KIND_CODE, KIND_DATA_FORMAT, KIND_EXTRACTION, KIND_REWRITE, KIND_MATH,
    KIND_CREATIVE, KIND_CHAT, KIND_QA, N_KINDS
};
/* the base cues ``kinds.kind_of`` reads, at their places in ``DENSE_BASE`` */
enum { B_MAX_REP = 3, B_FENCE = 4, B_JSON_KEYS = 7, B_DIGITS = 11, B_NUMSEQ = 12, B_CODE_KW = 13, B_SPEAKERS = 16 };

/* ``sum`` of floats from the int 0, as the running interpreter adds them (from 3.12 with Neumaier's
   compensation, the first one plainly) */
typedef struct {
    double total, compensation;
    int first;
} PySum;

static inline void pysum_add(PySum *s, double x)
{
#if PY_VERSION_HEX >= 0x030C0000
    if (s->first) {
        s->total = 0.0 + x;
        s->first = 0;
        return;
    }
    double t = s->total + x;
    if (fabs(s->total) >= fabs(x)) {
        s->compensation += (s->total - t) + x;
    }
    else {
        s->compensation += (x - t) + s->total;
    }
    s->total = t;
#else
    s->total += x;
#endif
}

static inline double pysum_result(const PySum *s)
{
#if PY_VERSION_HEX >= 0x030C0000
    if (s->compensation != 0.0 && isfinite(s->compensation)) {
        return s->total + s->compensation;
    }
#endif
    return s->total;
}

typedef struct {
    int ns, twin; /* twin: -1 for none */
    Py_ssize_t orders[8], norders;
    GramTable *table, *merged; /* merged: NULL for none */
} CharStep;

typedef struct {
    int ns, twin;
    GramTable *table, *merged;
    PyObject *weights, *merged_weights; /* the same tables as dicts (merged_weights: NULL for none), for sets */
} WordStep;

typedef struct {
    PyObject_HEAD
    double bias, p_floor, threshold;
    CharStep chars[4];
    WordStep words[4];
    int n_chars, n_words;
    int need_chars[4], need_words[4];
    PyObject *first;   /* dict of the first words' weights, or NULL */
    DenseReader *reader;
    double *dense;     /* a weight per name of the reader, 0.0 where the model has none */
    GramTable *cues, *context_cues, *code;
    double *cal_z, *cal_p; /* NULL without a calibration table */
    Py_ssize_t n_cal;
    PyObject *prediction, *labels, *kinds;
    Py_ssize_t kind_cues[N_KIND_CUES];
} Scorer;

static void Scorer_clear(Scorer *self)
{
    for (int k = 0; k < self->n_chars; k++) {
        Py_CLEAR(self->chars[k].table);
        Py_CLEAR(self->chars[k].merged);
    }
    for (int k = 0; k < self->n_words; k++) {
        Py_CLEAR(self->words[k].table);
        Py_CLEAR(self->words[k].merged);
        Py_CLEAR(self->words[k].weights);
        Py_CLEAR(self->words[k].merged_weights);
    }
    self->n_chars = self->n_words = 0;
    Py_CLEAR(self->first);
    Py_CLEAR(self->reader);
    Py_CLEAR(self->cues);
    Py_CLEAR(self->context_cues);
    Py_CLEAR(self->code);
    Py_CLEAR(self->prediction);
    Py_CLEAR(self->labels);
    Py_CLEAR(self->kinds);
    PyMem_Free(self->dense);
    PyMem_Free(self->cal_z);
    PyMem_Free(self->cal_p);
    self->dense = self->cal_z = self->cal_p = NULL;
}

static void Scorer_dealloc(Scorer *self)
{
    Scorer_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static GramTable *gram_table_or_none(PyObject *o, int none_ok)
{
    if (o == Py_None && none_ok) {
        return NULL;
    }
    if (!PyObject_TypeCheck(o, &GramTableType) || ((GramTable *)o)->keys == NULL) {
        PyErr_SetString(PyExc_TypeError, "expected a GramTable");
        return NULL;
    }
    return (GramTable *)Py_NewRef(o);
}

static double *float_array(PyObject *seq, Py_ssize_t n)
{
    double *out = PyMem_Malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    if (out == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *x = PyTuple_GET_ITEM(seq, k);
        if (!PyFloat_CheckExact(x)) {
            PyMem_Free(out);
            PyErr_SetString(PyExc_TypeError, "expected floats");
            return NULL;
        }
        out[k] = PyFloat_AS_DOUBLE(x);
    }
    return out;
}

static int Scorer_init(Scorer *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"bias", "chars", "words", "first", "dense", "reader", "cues", "context_cues", "code",
                             "calibration", "p_floor", "threshold", "prediction", "labels", "kinds",
                             "kind_cues", NULL};
    double bias, p_floor, threshold;
    PyObject *chars, *words, *first, *dense, *reader, *cues, *context_cues, *code, *calibration, *prediction,
        *labels, *kinds, *kind_cues;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "dO!O!OO!O!OOOOddOO!O!O!", kwlist, &bias, &PyList_Type, &chars,
                                     &PyList_Type, &words, &first, &PyDict_Type, &dense, &DenseReaderType, &reader,
                                     &cues, &context_cues, &code, &calibration, &p_floor, &threshold, &prediction,
                                     &PyTuple_Type, &labels, &PyTuple_Type, &kinds, &PyTuple_Type, &kind_cues)) {
        return -1;
    }
    Scorer_clear(self);
    memset(self->need_chars, 0, sizeof(self->need_chars));
    memset(self->need_words, 0, sizeof(self->need_words));
    self->bias = bias;
    self->p_floor = p_floor;
    self->threshold = threshold;
    if (PyList_GET_SIZE(chars) > 4 || PyList_GET_SIZE(words) > 4) {
        PyErr_SetString(PyExc_ValueError, "at most 4 character and 4 word namespaces");
        goto fail;
    }
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(chars); k++) {
        PyObject *step = PyList_GET_ITEM(chars, k), *orders, *table, *merged;
        CharStep *c = &self->chars[self->n_chars];
        if (!PyArg_ParseTuple(step, "iO!OiO", &c->ns, &PyTuple_Type, &orders, &table, &c->twin, &merged)) {
            goto fail;
        }
        if (c->ns < 0 || c->ns > 3 || c->twin < -1 || c->twin > 3) {
            PyErr_SetString(PyExc_ValueError, "a character namespace is 0 to 3");
            goto fail;
        }
        c->norders = read_orders(orders, c->orders);
        if (c->norders < 0 || (c->table = gram_table_or_none(table, 0)) == NULL) {
            goto fail;
        }
        c->merged = gram_table_or_none(merged, 1);
        self->n_chars++;
        if (c->merged == NULL && PyErr_Occurred()) {
            goto fail;
        }
        self->need_chars[c->ns] = 1;
    }
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(words); k++) {
        PyObject *step = PyList_GET_ITEM(words, k), *table, *merged, *weights, *merged_weights;
        WordStep *w = &self->words[self->n_words];
        if (!PyArg_ParseTuple(step, "iOiOO!O", &w->ns, &table, &w->twin, &merged, &PyDict_Type, &weights,
                              &merged_weights)) {
            goto fail;
        }
        if ((merged == Py_None) != (merged_weights == Py_None) ||
            (merged_weights != Py_None && !PyDict_Check(merged_weights))) {
            PyErr_SetString(PyExc_TypeError, "a merged table comes with its dict, and only with it");
            goto fail;
        }
        if (w->ns < 0 || w->ns > 3 || w->twin < -1 || w->twin > 3) {
            PyErr_SetString(PyExc_ValueError, "a word namespace is 0 to 3");
            goto fail;
        }
        if ((w->table = gram_table_or_none(table, 0)) == NULL) {
            goto fail;
        }
        w->merged = gram_table_or_none(merged, 1);
        self->n_words++;
        if (w->merged == NULL && PyErr_Occurred()) {
            goto fail;
        }
        w->weights = Py_NewRef(weights);
        w->merged_weights = merged_weights == Py_None ? NULL : Py_NewRef(merged_weights);
        self->need_words[w->ns] = 1;
    }
    if (first != Py_None) {
        if (!PyDict_Check(first)) {
            PyErr_SetString(PyExc_TypeError, "first: a dict or None");
            goto fail;
        }
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(first, &pos, &key, &value)) {
            if (!PyFloat_CheckExact(value)) {
                PyErr_SetString(PyExc_TypeError, "the first words' weights must be floats");
                goto fail;
            }
        }
        self->first = Py_NewRef(first);
    }
    DenseReader *r = (DenseReader *)reader;
    if (r->names == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "dense reader not initialised");
        goto fail;
    }
    self->reader = (DenseReader *)Py_NewRef(reader);
    Py_ssize_t n_names = PyTuple_GET_SIZE(r->names);
    self->dense = PyMem_Calloc((size_t)n_names, sizeof(double));
    if (self->dense == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t k = 0; k < n_names; k++) {
        PyObject *w = PyDict_GetItemWithError(dense, PyTuple_GET_ITEM(r->names, k));
        if (w == NULL && PyErr_Occurred()) {
            goto fail;
        }
        if (w != NULL && !PyFloat_CheckExact(w)) {
            PyErr_SetString(PyExc_TypeError, "the dense weights must be floats");
            goto fail;
        }
        self->dense[k] = w == NULL ? 0.0 : PyFloat_AS_DOUBLE(w);
    }
    if ((self->cues = gram_table_or_none(cues, 0)) == NULL ||
        (self->context_cues = gram_table_or_none(context_cues, 0)) == NULL ||
        (self->code = gram_table_or_none(code, 0)) == NULL) {
        goto fail;
    }
    if (r->n_cues > 64 || r->n_context > 64) {
        PyErr_SetString(PyExc_ValueError, "at most 64 cue lexicons");
        goto fail;
    }
    if (calibration != Py_None) {
        PyObject *zs, *ps;
        if (!PyArg_ParseTuple(calibration, "O!O!", &PyTuple_Type, &zs, &PyTuple_Type, &ps)) {
            goto fail;
        }
        self->n_cal = PyTuple_GET_SIZE(zs);
        if (self->n_cal < 1 || PyTuple_GET_SIZE(ps) != self->n_cal) {
            PyErr_SetString(PyExc_ValueError, "a calibration table of as many knots as values, one at least");
            goto fail;
        }
        if ((self->cal_z = float_array(zs, self->n_cal)) == NULL ||
            (self->cal_p = float_array(ps, self->n_cal)) == NULL) {
            goto fail;
        }
    }
    if (PyTuple_GET_SIZE(labels) != 2 || PyTuple_GET_SIZE(kinds) != N_KINDS ||
        PyTuple_GET_SIZE(kind_cues) != N_KIND_CUES) {
        PyErr_Format(PyExc_ValueError, "expected 2 labels, %d kinds and %d cue places", N_KINDS, N_KIND_CUES);
        goto fail;
    }
    for (Py_ssize_t k = 0; k < N_KIND_CUES; k++) {
        Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GET_ITEM(kind_cues, k));
        if (at == -1 && PyErr_Occurred()) {
            goto fail;
        }
        if (at < 0 || at >= r->n_cues) {
            PyErr_SetString(PyExc_ValueError, "a cue place out of range");
            goto fail;
        }
        self->kind_cues[k] = at;
    }
    self->prediction = Py_NewRef(prediction);
    self->labels = Py_NewRef(labels);
    self->kinds = Py_NewRef(kinds);
    return 0;
fail:
    Scorer_clear(self);
    return -1;
}

/* ``s.lower()``: an ASCII text without a capital is itself */
static PyObject *lowered(PyObject *s)
{
    if (!PyUnicode_IS_ASCII(s)) {
        return PyObject_CallMethodNoArgs(s, lower_name);
    }
    const Py_UCS1 *data = PyUnicode_1BYTE_DATA(s);
    Py_ssize_t n = PyUnicode_GET_LENGTH(s), i = 0;
    while (i < n && !(data[i] >= 'A' && data[i] <= 'Z')) {
        i++;
    }
    if (i == n) {
        return Py_NewRef(s);
    }
    PyObject *out = PyUnicode_New(n, 127);
    if (out == NULL) {
        return NULL;
    }
    Py_UCS1 *dst = PyUnicode_1BYTE_DATA(out);
    memcpy(dst, data, (size_t)i);
    for (; i < n; i++) {
        Py_UCS1 c = data[i];
        dst[i] = c >= 'A' && c <= 'Z' ? (Py_UCS1)(c + ('a' - 'A')) : c;
    }
    return out;
}

/* ``text[start:end].lower()`` */
static PyObject *lowered_slice(PyObject *text, Py_ssize_t start, Py_ssize_t end)
{
    PyObject *part = PyUnicode_Substring(text, start, end);
    if (part == NULL) {
        return NULL;
    }
    PyObject *out = lowered(part);
    Py_DECREF(part);
    return out;
}

/* ``a + "\n" + b`` of two slices of ``text``, in the narrowest form that holds them as ``+`` makes it */
static PyObject *joined_slices(PyObject *text, Py_ssize_t a0, Py_ssize_t a1, Py_ssize_t b0, Py_ssize_t b1)
{
    PyObject *a = PyUnicode_Substring(text, a0, a1), *b = PyUnicode_Substring(text, b0, b1), *out = NULL;
    if (a != NULL && b != NULL) {
        Py_ssize_t la = PyUnicode_GET_LENGTH(a), lb = PyUnicode_GET_LENGTH(b);
        Py_UCS4 maxchar = PyUnicode_MAX_CHAR_VALUE(a);
        if (PyUnicode_MAX_CHAR_VALUE(b) > maxchar) {
            maxchar = PyUnicode_MAX_CHAR_VALUE(b);
        }
        out = PyUnicode_New(la + 1 + lb, maxchar);
        if (out != NULL) {
            PyUnicode_WRITE(PyUnicode_KIND(out), PyUnicode_DATA(out), la, '\n');
            if (PyUnicode_CopyCharacters(out, 0, a, 0, la) < 0 || PyUnicode_CopyCharacters(out, la + 1, b, 0, lb) < 0) {
                Py_CLEAR(out);
            }
        }
    }
    Py_XDECREF(a);
    Py_XDECREF(b);
    return out;
}

/* ``features._norm`` of ``text[start:end]`` */
static PyObject *norm_slice(PyObject *text, Py_ssize_t start, Py_ssize_t end)
{
    PyObject *part = PyUnicode_Substring(text, start, end);
    if (part == NULL) {
        return NULL;
    }
    PyObject *out = norm(NULL, part);
    Py_DECREF(part);
    return out;
}

static inline int ends_sentence(Py_UCS4 c) /* ``(?<=[.!?;:])`` */
{
    return c == '.' || c == '!' || c == '?' || c == ';' || c == ':';
}

static inline int ends_cjk_sentence(Py_UCS4 c) /* ``(?<=[\u3002\uff01\uff1f\uff1a])`` */
{
    return c == 0x3002 || c == 0xff01 || c == 0xff1f || c == 0xff1a;
}

/* The end of the last match of ``_SEGMENT_END`` in the line ``t[lo:hi]`` (no "\n" in it; ``t[hi - 1]`` is
   not white space), -1 for none. Its matches are the white space runs after a sentence mark, whole, and the
   empty places after a CJK mark: no run holds such a place, so they never overlap and the last one is
   found from the end. */
static Py_ssize_t last_segment_end(const Text *t, Py_ssize_t lo, Py_ssize_t hi)
{
    Py_ssize_t i = hi;
    while (i > lo) {
        Py_UCS4 c = AT(t, i - 1);
        if (ends_cjk_sentence(c)) {
            return i;
        }
        if (is_space(c)) {
            Py_ssize_t r = i - 1;
            while (r > lo && is_space(AT(t, r - 1))) {
                r--;
            }
            if (r > lo && ends_sentence(AT(t, r - 1))) {
                return i;
            }
            i = r;
            continue;
        }
        i--;
    }
    return -1;
}

/* ``features.last_segment(text)`` as the extent [*a, *b) of ``text``, empty for "" */
static void last_segment(const Text *t, Py_ssize_t *a, Py_ssize_t *b)
{
    *a = *b = 0;
    if (t->len <= LAST_MIN_TEXT) {
        return;
    }
    Py_ssize_t start = t->len > LAST_MAX + 1 ? t->len - (LAST_MAX + 1) : 0, end = t->len;
    while (end > start && is_space(AT(t, end - 1))) { /* ``.rstrip()`` */
        end--;
    }
    Py_ssize_t line = end; /* the last line: after the last "\n" */
    while (line > start && AT(t, line - 1) != '\n') {
        line--;
    }
    Py_ssize_t from = last_segment_end(t, line, end), lo, hi = end;
    if (from < 0) { /* one piece: the line */
        lo = line;
    }
    else if (from < end) {
        lo = from;
    }
    else { /* the last piece is empty (a CJK mark ends the line): the one before it */
        Py_ssize_t before = last_segment_end(t, line, end - 1);
        lo = before < 0 ? line : before;
    }
    strip_range(t, &lo, &hi);
    if (hi - lo < LAST_MAX) {
        *a = lo;
        *b = hi;
    }
}

static int lower_and_hash(PyObject *text, Py_ssize_t start, Py_ssize_t end, int bigrams, Words *w)
{
    PyObject *low = lowered_slice(text, start, end);
    if (low == NULL) {
        return -1;
    }
    int rc = hash_words(low, bigrams, w);
    Py_DECREF(low);
    return rc;
}

static inline double lexicon_flag(uint64_t bits, Py_ssize_t k)
{
    return bits >> k & 1 ? 1.0 : 0.0;
}

/* The cue bits of ``features._cjk_grams`` over ``t[start:end]``: each character of a run of CJK characters
   and each two neighbours in it, hashed as ``gram_hash`` hashes their strings and looked up in the cue table.
   ``*budget`` is what is left of CJK_MAX characters: the head and the tail window read one after the other
   share it, as the runs of their join (a line break between them) do. */
static uint64_t cjk_bits(const GramTable *cues, const Text *t, Py_ssize_t start, Py_ssize_t end,
                         Py_ssize_t *budget)
{
    uint64_t bits = 0;
    Py_ssize_t i = start;
    while (i < end && *budget > 0) {
        if (!is_cjk(AT(t, i))) {
            i++;
            continue;
        }
        Py_ssize_t run_end = i + 1;
        while (run_end < end && is_cjk(AT(t, run_end))) {
            run_end++;
        }
        Py_ssize_t stop = run_end - i > *budget ? i + *budget : run_end; /* ``run[:budget]`` */
        for (Py_ssize_t j = i; j < stop; j++) {
            bits |= (uint64_t)lookup(cues, gram_hash(t->kind, t->data, j, 1));
            if (j + 1 < stop) {
                bits |= (uint64_t)lookup(cues, gram_hash(t->kind, t->data, j, 2));
            }
        }
        *budget -= stop - i;
        i = run_end;
    }
    return bits;
}

/* ``word_grams(text[start:end].lower())[1]``, or with ``tokens_only`` ``set(word_grams(...)[0])``: the set
   ``features.extract`` builds, its strings added in the same order */
static PyObject *word_set(PyObject *text, Py_ssize_t start, Py_ssize_t end, int tokens_only)
{
    PyObject *low = lowered_slice(text, start, end);
    if (low == NULL) {
        return NULL;
    }
    PyObject *both = word_grams(NULL, low);
    Py_DECREF(low);
    if (both == NULL) {
        return NULL;
    }
    PyObject *out = tokens_only ? PySet_New(PyTuple_GET_ITEM(both, 0)) : Py_NewRef(PyTuple_GET_ITEM(both, 1));
    Py_DECREF(both);
    return out;
}

/* ``sum(map(weights.get, grams, repeat(0.0))) / math.sqrt(len(grams))`` over a non-empty set, in the set's
   own order: 0; 1 where a weight is not a float (the interpreter's arithmetic is not this one); -1 with the
   error. */
static int set_share(PyObject *weights, PyObject *grams, double *out)
{
    PySum sum = {0.0, 0.0, 1};
    PyObject *it = PyObject_GetIter(grams), *g;
    if (it == NULL) {
        return -1;
    }
    while ((g = PyIter_Next(it)) != NULL) {
        PyObject *w = PyDict_GetItemWithError(weights, g);
        Py_DECREF(g);
        if (w == NULL && PyErr_Occurred()) {
            Py_DECREF(it);
            return -1;
        }
        if (w != NULL && !PyFloat_CheckExact(w)) {
            Py_DECREF(it);
            return 1;
        }
        pysum_add(&sum, w == NULL ? 0.0 : PyFloat_AS_DOUBLE(w));
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) {
        return -1;
    }
    *out = pysum_result(&sum) / sqrt((double)PySet_GET_SIZE(grams));
    return 0;
}

/* The first words' share of the score (``f``: the first all-letter word of the scanned window, and the
   first two joined by a space): 1 with it in ``*out``, 0 where the model or the window has none, -1 with
   an error. A set of two grams sums to the same float in either order. */
static int first_share(const Scorer *self, PyObject *low, const Words *sc, double *out)
{
    if (self->first == NULL || sc->nfirst == 0) {
        return 0;
    }
    PyObject *grams[2] = {NULL, NULL};
    PySum sum = {0.0, 0.0, 1};
    int ok = 1;
    for (Py_ssize_t f = 0; f < sc->nfirst && ok; f++) {
        PyObject *word = PyUnicode_Substring(low, sc->first_start[f], sc->first_start[f] + sc->first_len[f]);
        if (word == NULL) {
            ok = 0;
        }
        else if (f == 0) {
            grams[0] = word;
        }
        else {
            grams[1] = pair(grams[0], word);
            Py_DECREF(word);
            ok = grams[1] != NULL;
        }
    }
    for (int g = 0; g < 2 && ok && grams[g] != NULL; g++) {
        PyObject *w = PyDict_GetItemWithError(self->first, grams[g]);
        if (w == NULL && PyErr_Occurred()) {
            ok = 0;
        }
        else if (w != NULL && !PyFloat_CheckExact(w)) {
            PyErr_SetString(PyExc_TypeError, "the first words' weights must be floats");
            ok = 0;
        }
        else {
            pysum_add(&sum, w == NULL ? 0.0 : PyFloat_AS_DOUBLE(w));
        }
    }
    Py_XDECREF(grams[0]);
    Py_XDECREF(grams[1]);
    if (!ok) {
        return -1;
    }
    *out = pysum_result(&sum) / sqrt((double)sc->nfirst);
    return 1;
}

PyDoc_STRVAR(scorer_predict_doc,
             "predict(text, context, turns, has_system, tools, constrained, shift) -> Prediction | None\n\n"
             "``Classifier.predict`` of a view with these fields and the request fields' ``shift``; None where "
             "a word weight the sets of a window with CJK characters read is not a float (the caller then "
             "reads it).");

static PyObject *Scorer_predict(Scorer *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7 || !PyUnicode_Check(args[0]) || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "predict(text: str, context: str, turns: int, has_system: bool, "
                                         "tools: bool, constrained: float, shift: float)");
        return NULL;
    }
    if (self->reader == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "scorer not initialised");
        return NULL;
    }
    PyObject *text = args[0], *ctx = args[1];
    Py_ssize_t turns = PyLong_AsSsize_t(args[2]);
    int has_system = turns == -1 && PyErr_Occurred() ? -1 : PyObject_IsTrue(args[3]);
    int tools = has_system < 0 ? -1 : PyObject_IsTrue(args[4]);
    int constrained = tools < 0 ? -1 : PyObject_IsTrue(args[5]);
    double shift = constrained < 0 ? -1.0 : PyFloat_AsDouble(args[6]);
    if (shift == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    if (MAKE_READY(text) == -1 || MAKE_READY(ctx) == -1) {
        return NULL;
    }
    Py_ssize_t len = PyUnicode_GET_LENGTH(text), clen = PyUnicode_GET_LENGTH(ctx);
    PyObject *scanned = len <= WINDOW_HEAD + WINDOW_TAIL
                            ? Py_NewRef(text)
                            : joined_slices(text, 0, WINDOW_HEAD, len - WINDOW_TAIL, len);
    if (scanned == NULL) {
        return NULL;
    }
    int cjk = 0; /* ``features.extract``'s ``cjk``: a character from U+3040 on in the scanned window */
    if (!PyUnicode_IS_ASCII(scanned)) {
        Text s = {PyUnicode_KIND(scanned), PyUnicode_DATA(scanned), PyUnicode_GET_LENGTH(scanned)};
        for (Py_ssize_t i = 0; i < s.len && !cjk; i++) {
            cjk = AT(&s, i) >= 0x3040;
        }
    }
    PyObject *result = NULL, *low = NULL, *windows[4] = {NULL, NULL, NULL, NULL};
    PyObject *sets[4] = {NULL, NULL, NULL, NULL}, *scanned_set = NULL; /* a CJK window's word sets */
    Words sc = {0}, head = {0}, tail = {0}, context = {0}, last = {0}, whole_context = {0};
    Words *word_windows[4] = {NULL, NULL, NULL, NULL};
    Py_ssize_t last_a = 0, last_b = 0;

    /* the words: the scanned window, the tail and head windows (the scanned one where the text is short),
       the cue lexicons' bits and the code keywords */
    low = lowered(scanned);
    if (low == NULL || hash_words(low, 1, &sc) < 0) {
        goto done;
    }
    Words *tail_w = &sc, *head_w = &sc;
    if (len > TAIL_NS) {
        if (lower_and_hash(text, len - TAIL_NS, len, 1, &tail) < 0) {
            goto done;
        }
        tail_w = &tail;
    }
    if (len > HEAD_NS) {
        if (lower_and_hash(text, 0, HEAD_NS, 1, &head) < 0) {
            goto done;
        }
        head_w = &head;
    }
    uint64_t bits = hashes_bits(self->cues, head_w->hashes, head_w->n);
    if (tail_w != head_w) {
        bits |= hashes_bits(self->cues, tail_w->hashes, tail_w->n);
    }
    if (cjk) { /* the CJK grams of ``text[:HEAD_NS] + "\n" + text[-TAIL_NS:]``, as they are (not lowered) */
        Text t = {PyUnicode_KIND(text), PyUnicode_DATA(text), len};
        Py_ssize_t budget = CJK_MAX;
        bits |= cjk_bits(self->cues, &t, 0, len < HEAD_NS ? len : HEAD_NS, &budget);
        bits |= cjk_bits(self->cues, &t, len > TAIL_NS ? len - TAIL_NS : 0, len, &budget);
    }
    Py_ssize_t code_kw = (Py_ssize_t)hashes_sum(self->code, sc.hashes, sc.n);
    uint64_t context_bits = 0;
    if (clen) {
        if (lower_and_hash(ctx, 0, clen < CONTEXT_HEAD_NS ? clen : CONTEXT_HEAD_NS, 1, &context) < 0) {
            goto done;
        }
        context_bits = hashes_bits(self->context_cues, context.hashes, context.n);
    }
    int with_context = clen && (self->need_words[NS_X] || self->need_chars[NS_CX]);
    word_windows[NS_WH] = head_w;
    word_windows[NS_WT] = tail_w;
    if (self->need_words[NS_WL]) {
        Text t = {PyUnicode_KIND(text), PyUnicode_DATA(text), len};
        last_segment(&t, &last_a, &last_b);
        if (last_b > last_a && !cjk) {
            if (lower_and_hash(text, last_a, last_b, 1, &last) < 0) {
                goto done;
            }
            word_windows[NS_WL] = &last;
        }
    }
    if (with_context && self->need_words[NS_X] && !cjk) {
        if (lower_and_hash(ctx, 0, clen < CONTEXT_WINDOW ? clen : CONTEXT_WINDOW, 0, &whole_context) < 0) {
            goto done;
        }
        word_windows[NS_X] = &whole_context;
    }

    /* the character windows (``features.char_windows``; a short text's head and tail are one window) */
    if (self->need_chars[NS_CH] || self->need_chars[NS_CT]) {
        windows[NS_CH] = norm_slice(text, 0, len < CHAR_HEAD ? len : CHAR_HEAD);
        if (windows[NS_CH] == NULL) {
            goto done;
        }
    }
    if (self->need_chars[NS_CT]) {
        windows[NS_CT] = len <= CHAR_HEAD ? Py_NewRef(windows[NS_CH]) : norm_slice(text, len > CHAR_TAIL ? len - CHAR_TAIL : 0, len);
        if (windows[NS_CT] == NULL) {
            goto done;
        }
    }
    if (self->need_chars[NS_CB] && len > CHAR_HEAD + CHAR_TAIL) {
        PyObject *body = len - CHAR_HEAD - CHAR_TAIL > 2 * CHAR_BODY
                             ? joined_slices(text, CHAR_HEAD, CHAR_HEAD + CHAR_BODY, len - CHAR_TAIL - CHAR_BODY,
                                             len - CHAR_TAIL)
                             : PyUnicode_Substring(text, CHAR_HEAD, len - CHAR_TAIL);
        if (body == NULL) {
            goto done;
        }
        PyObject *normed = norm(NULL, body);
        Py_DECREF(body);
        if (normed == NULL) {
            goto done;
        }
        Py_ssize_t n = PyUnicode_GET_LENGTH(normed);
        windows[NS_CB] = PyUnicode_Substring(normed, 0, n < 2 * CHAR_BODY ? n : 2 * CHAR_BODY);
        Py_DECREF(normed);
        if (windows[NS_CB] == NULL) {
            goto done;
        }
    }
    if (with_context && self->need_chars[NS_CX]) {
        windows[NS_CX] = norm_slice(ctx, 0, clen < CHAR_CONTEXT ? clen : CHAR_CONTEXT);
        if (windows[NS_CX] == NULL) {
            goto done;
        }
    }

    /* the structural cues */
    double base[N_BASE];
    int layout[N_LAYOUT];
    if (dense_values(text, scanned, sc.tokens, sc.marks, code_kw, turns, has_system, clen, base, layout) < 0) {
        goto done;
    }

    /* ``Classifier.score``: the bias, the character namespaces, the word namespaces, the first words, the
       dense cues */
    double z = self->bias;
    double share = 0.0;
    for (int k = 0; k < self->n_chars; k++) {
        const CharStep *c = &self->chars[k];
        PyObject *window = windows[c->ns];
        if (window == NULL || PyUnicode_GET_LENGTH(window) == 0) {
            continue;
        }
        const GramTable *table = c->table;
        if (c->twin >= 0 && windows[c->twin] == window) {
            if (c->merged == NULL) {
                continue;
            }
            table = c->merged;
        }
        double total;
        Py_ssize_t distinct;
        if (gram_score(table, window, c->orders, c->norders, &total, &distinct) < 0) {
            goto done;
        }
        if (distinct) {
            share += total / sqrt((double)distinct);
        }
    }
    z += share;
    double first = 0.0;
    int has_first = first_share(self, low, &sc, &first);
    if (has_first < 0) {
        goto done;
    }
    if (!cjk) {
        share = 0.0;
        for (int k = 0; k < self->n_words; k++) {
            const WordStep *w = &self->words[k];
            Words *words = word_windows[w->ns];
            if (words == NULL || words->n == 0) {
                continue;
            }
            const GramTable *table = w->table;
            if (w->twin >= 0 && word_windows[w->twin] == words) {
                if (w->merged == NULL) {
                    continue;
                }
                table = w->merged;
            }
            share += hashes_sum(table, words->hashes, words->n) / sqrt((double)words->n);
        }
        z += share;
        if (has_first) {
            z += first;
        }
    }
    else {
        /* the sets ``features.extract`` builds for the word namespaces with weights (a short text's head and
           tail window one set, the scanned window's), each namespace's share added on its own in
           ``NAMESPACES`` order, the first words between the tail window and the chat context */
        for (int k = 0; k < self->n_words; k++) {
            int ns = self->words[k].ns;
            if (sets[ns] != NULL) {
                continue;
            }
            if ((ns == NS_WH && len <= HEAD_NS) || (ns == NS_WT && len <= TAIL_NS)) {
                if (scanned_set == NULL) {
                    PyObject *both = word_grams(NULL, low);
                    if (both == NULL) {
                        goto done;
                    }
                    scanned_set = Py_NewRef(PyTuple_GET_ITEM(both, 1));
                    Py_DECREF(both);
                }
                sets[ns] = Py_NewRef(scanned_set);
            }
            else if (ns == NS_WH) {
                sets[ns] = word_set(text, 0, HEAD_NS, 0);
            }
            else if (ns == NS_WT) {
                sets[ns] = word_set(text, len - TAIL_NS, len, 0);
            }
            else if (ns == NS_WL) {
                sets[ns] = last_b > last_a ? word_set(text, last_a, last_b, 0) : PySet_New(NULL);
            }
            else {
                sets[ns] = with_context ? word_set(ctx, 0, clen < CONTEXT_WINDOW ? clen : CONTEXT_WINDOW, 1)
                                        : PySet_New(NULL);
            }
            if (sets[ns] == NULL) {
                goto done;
            }
        }
        static const int order[5] = {NS_WH, NS_WT, -1, NS_X, NS_WL}; /* -1: the first words */
        for (int o = 0; o < 5; o++) {
            if (order[o] < 0) {
                if (has_first) {
                    z += first;
                }
                continue;
            }
            for (int k = 0; k < self->n_words; k++) {
                const WordStep *w = &self->words[k];
                PyObject *grams = sets[w->ns], *weights = w->weights;
                if (w->ns != order[o] || PySet_GET_SIZE(grams) == 0) {
                    continue;
                }
                if (w->twin >= 0 && sets[w->twin] == grams) {
                    if (w->merged_weights == NULL) {
                        continue;
                    }
                    weights = w->merged_weights;
                }
                double part;
                int rc = set_share(weights, grams, &part);
                if (rc < 0) {
                    goto done;
                }
                if (rc > 0) { /* the Python adds what is not a float its own way */
                    result = Py_NewRef(Py_None);
                    goto done;
                }
                z += part;
            }
        }
    }
    {
        /* the dense cues in the order ``features`` writes them: base, the layout cues that are set, the cue
           lexicons, the chat context's */
        PySum sum = {0.0, 0.0, 1};
        const double *w = self->dense;
        for (int k = 0; k < N_BASE; k++) {
            pysum_add(&sum, w[k] * base[k]);
        }
        for (int k = 0; k < N_LAYOUT; k++) {
            if (layout[k]) {
                pysum_add(&sum, w[N_BASE + k] * 1.0);
            }
        }
        Py_ssize_t at = N_BASE + N_LAYOUT, n_cues = self->reader->n_cues;
        for (Py_ssize_t k = 0; k < n_cues; k++) {
            pysum_add(&sum, w[at + k] * lexicon_flag(bits, k));
        }
        if (clen) {
            for (Py_ssize_t k = 0; k < self->reader->n_context; k++) {
                pysum_add(&sum, w[at + n_cues + k] * lexicon_flag(context_bits, k));
            }
        }
        z = z + pysum_result(&sum);
    }

    /* ``Classifier.calibrated``: the table (bisection, linear between knots, flat beyond) and ``logit`` */
    if (self->cal_z != NULL) {
        const double *zs = self->cal_z, *ps = self->cal_p;
        Py_ssize_t lo = 0, hi = self->n_cal;
        while (lo < hi) { /* ``bisect.bisect_right`` */
            Py_ssize_t mid = (lo + hi) / 2;
            if (z < zs[mid]) {
                hi = mid;
            }
            else {
                lo = mid + 1;
            }
        }
        double p;
        if (lo == 0) {
            p = ps[0];
        }
        else if (lo == self->n_cal) {
            p = ps[self->n_cal - 1];
        }
        else {
            double z0 = zs[lo - 1], z1 = zs[lo];
            p = ps[lo - 1] + (ps[lo] - ps[lo - 1]) * (z - z0) / (z1 - z0);
        }
        double top = 1.0 - self->p_floor, kept = self->p_floor; /* ``min(1 - P_FLOOR, max(P_FLOOR, p))`` */
        if (p > kept) {
            kept = p;
        }
        if (!(kept < top)) {
            kept = top;
        }
        z = log(kept / (1.0 - kept));
    }
    z = z + shift;

    /* ``_sigmoid``, the label and ``kinds.kind_of`` */
    double p;
    if (z >= 0) {
        p = 1.0 / (1.0 + exp(-z));
    }
    else {
        double e = exp(z);
        p = e / (1.0 + e);
    }
#define CUE(k) ((bits >> self->kind_cues[k]) & 1)
    int kind;
    if (tools) {
        kind = KIND_TOOLS;
    }
    else if (constrained) {
        kind = KIND_DATA_FORMAT;
    }
    else if (base[B_NUMSEQ] != 0.0 || base[B_MAX_REP] > 0.5 || CUE(K_REPEAT)) {
        kind = KIND_REPETITION;
    }
    else if (base[B_FENCE] != 0.0 || base[B_CODE_KW] > 0.8 || CUE(K_CODE)) {
        kind = KIND_CODE;
    }
    else if (base[B_JSON_KEYS] > 0.5 || CUE(K_FORMAT) || CUE(K_CONFIG) || CUE(K_TEMPLATE)) {
        kind = KIND_DATA_FORMAT;
    }
    else if (CUE(K_EXTRACT)) {
        kind = KIND_EXTRACTION;
    }
    else if (CUE(K_REWRITE)) {
        kind = KIND_REWRITE;
    }
    else if (base[B_DIGITS] > 0.15 && CUE(K_MATH)) {
        kind = KIND_MATH;
    }
    else if (CUE(K_CREATIVE)) {
        kind = KIND_CREATIVE;
    }
    else if (turns >= 3 || base[B_SPEAKERS] > 0.5) {
        kind = KIND_CHAT;
    }
    else {
        kind = KIND_QA;
    }
#undef CUE
    PyObject *p_obj = PyFloat_FromDouble(p);
    if (p_obj == NULL) {
        goto done;
    }
    PyObject *call_args[3] = {p_obj, PyTuple_GET_ITEM(self->labels, p > self->threshold ? 0 : 1),
                              PyTuple_GET_ITEM(self->kinds, kind)};
    result = PyObject_Vectorcall(self->prediction, call_args, 3, NULL);
    Py_DECREF(p_obj);
done:
    Py_DECREF(scanned);
    Py_XDECREF(low);
    Py_XDECREF(scanned_set);
    for (int k = 0; k < 4; k++) {
        Py_XDECREF(windows[k]);
        Py_XDECREF(sets[k]);
    }
    PyMem_Free(sc.hashes);
    PyMem_Free(head.hashes);
    PyMem_Free(tail.hashes);
    PyMem_Free(context.hashes);
    PyMem_Free(last.hashes);
    PyMem_Free(whole_context.hashes);
    return result;
}

static PyMethodDef Scorer_methods[] = {
    {"predict", (PyCFunction)(void (*)(void))Scorer_predict, METH_FASTCALL, scorer_predict_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(Scorer_doc,
             "Scorer(bias, chars, words, first, dense, reader, cues, context_cues, code, calibration, p_floor, "
             "threshold, prediction, labels, kinds, kind_cues)\n\n"
             "A classifier's whole prediction after the request's view (``Classifier._scorer``).");

static PyTypeObject ScorerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "classifiers._grams.Scorer",
    .tp_basicsize = sizeof(Scorer),
    .tp_dealloc = (destructor)Scorer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = Scorer_doc,
    .tp_methods = Scorer_methods,
    .tp_init = (initproc)Scorer_init,
    .tp_new = PyType_GenericNew,
};

static PyMethodDef module_methods[] = {
    {"word_grams", (PyCFunction)word_grams, METH_O, word_grams_doc},
    {"word_hashes", (PyCFunction)(void (*)(void))word_hashes, METH_FASTCALL, word_hashes_doc},
    {"weighted_sum", (PyCFunction)(void (*)(void))weighted_sum, METH_FASTCALL, weighted_sum_doc},
    {"norm", (PyCFunction)norm, METH_O, norm_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef grams_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "classifiers._grams",
    .m_doc = "Character n-gram scoring without a Python object per gram, and the word n-grams of a text.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__grams(void)
{
    if (PyType_Ready(&GramTableType) < 0 || PyType_Ready(&DenseReaderType) < 0 || PyType_Ready(&ScorerType) < 0) {
        return NULL;
    }
    if (hash_token == NULL) {
        hash_token = PyUnicode_InternFromString("#");
        space = PyUnicode_InternFromString(" ");
        lower_name = PyUnicode_InternFromString("lower");
        if (hash_token == NULL || space == NULL || lower_name == NULL) {
            return NULL;
        }
    }
    PyObject *m = PyModule_Create(&grams_module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&GramTableType);
    if (PyModule_AddObject(m, "GramTable", (PyObject *)&GramTableType) < 0) {
        Py_DECREF(&GramTableType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&DenseReaderType);
    if (PyModule_AddObject(m, "DenseReader", (PyObject *)&DenseReaderType) < 0) {
        Py_DECREF(&DenseReaderType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&ScorerType);
    if (PyModule_AddObject(m, "Scorer", (PyObject *)&ScorerType) < 0) {
        Py_DECREF(&ScorerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
