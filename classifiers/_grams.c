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
    PyObject *text = args[0];
    PyObject *orders = args[1];
    if (MAKE_READY(text) == -1) {
        return NULL;
    }
    Py_ssize_t len = PyUnicode_GET_LENGTH(text);
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t norders = PyTuple_GET_SIZE(orders);
    Py_ssize_t total = 0;
    Py_ssize_t order_of[8];
    if (norders > 8) {
        PyErr_SetString(PyExc_ValueError, "at most 8 orders");
        return NULL;
    }
    for (Py_ssize_t k = 0; k < norders; k++) {
        Py_ssize_t n = PyLong_AsSsize_t(PyTuple_GET_ITEM(orders, k));
        if (n == -1 && PyErr_Occurred()) {
            return NULL;
        }
        if (n < 1 || n > MAX_ORDER) {
            PyErr_SetString(PyExc_ValueError, "orders must be between 1 and 16");
            return NULL;
        }
        order_of[k] = n;
        if (len >= n) {
            total += len - n + 1;
        }
    }
    uint64_t stack[STACK_SLOTS];
    size_t slots = slots_for(total);
    uint64_t *seen = stack;
    if (slots > STACK_SLOTS) {
        seen = PyMem_Calloc(slots, sizeof(uint64_t));
        if (seen == NULL) {
            return PyErr_NoMemory();
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
    return Py_BuildValue("(dn)", sum, distinct);
}

static Py_ssize_t GramTable_len(GramTable *self)
{
    return self->size;
}

/* The weights of the packed grams in the table: summed, or (``bits``) or-ed as whole numbers. */
static PyObject *packed_lookup(GramTable *self, PyObject *arg, int bits)
{
    if (!PyBytes_Check(arg) || PyBytes_GET_SIZE(arg) % 8 != 0) {
        PyErr_SetString(PyExc_TypeError, "expected the bytes of word_hashes (8 bytes a gram)");
        return NULL;
    }
    const char *data = PyBytes_AS_STRING(arg);
    Py_ssize_t n = PyBytes_GET_SIZE(arg) / 8;
    double sum = 0.0;
    uint64_t mask = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t h;
        memcpy(&h, data + 8 * i, 8);
        double w = lookup(self, h);
        if (bits) {
            mask |= (uint64_t)w;
        }
        else {
            sum += w;
        }
    }
    return bits ? PyLong_FromUnsignedLongLong(mask) : PyFloat_FromDouble(sum);
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
    Py_ssize_t len = PyUnicode_GET_LENGTH(text);
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Token *tokens = PyMem_Malloc(sizeof(Token) * (size_t)(len + 1));
    if (tokens == NULL) {
        return PyErr_NoMemory();
    }
    Py_ssize_t ntok = 0, marks = 0, nfirst = 0;
    Py_ssize_t first_at[2] = {0, 0};
    Py_ssize_t i = 0;
    while (next_token(kind, data, len, &i, &tokens[ntok])) {
        marks += tokens[ntok].sharp;
        if (tokens[ntok].alpha && nfirst < 2 && ntok < 6) {
            first_at[nfirst++] = ntok;
        }
        ntok++;
    }
    Py_ssize_t most = bigrams && ntok > 0 ? 2 * ntok - 1 : ntok;
    size_t slots = slots_for(most);
    uint64_t *seen = PyMem_Calloc(slots, sizeof(uint64_t));
    PyObject *packed = PyBytes_FromStringAndSize(NULL, 8 * most);
    PyObject *first = PyTuple_New(nfirst);
    if (seen == NULL || packed == NULL || first == NULL) {
        PyMem_Free(tokens);
        PyMem_Free(seen);
        Py_XDECREF(packed);
        Py_XDECREF(first);
        return seen == NULL ? PyErr_NoMemory() : NULL;
    }
    uint64_t *out = (uint64_t *)PyBytes_AS_STRING(packed); /* bytes data is 8-byte aligned in CPython */
    Py_ssize_t n = 0;
    for (Py_ssize_t k = 0; k < ntok; k++) {
        const Token *a = &tokens[k];
        add_hash(finish(fnv_token(FNV_OFFSET ^ (uint64_t)a->len, kind, data, a)), seen, slots - 1, out, &n);
        if (bigrams && k > 0) {
            const Token *p = &tokens[k - 1];
            uint64_t h = FNV_OFFSET ^ (uint64_t)(p->len + 1 + a->len);
            h = fnv_token(h, kind, data, p);
            h = (h ^ (uint64_t)' ') * FNV_PRIME;
            h = fnv_token(h, kind, data, a);
            add_hash(finish(h), seen, slots - 1, out, &n);
        }
    }
    for (Py_ssize_t f = 0; f < nfirst; f++) {
        const Token *t = &tokens[first_at[f]];
        PyObject *word = PyUnicode_Substring(text, t->start, t->start + t->len);
        if (word == NULL) {
            PyMem_Free(tokens);
            PyMem_Free(seen);
            Py_DECREF(packed);
            Py_DECREF(first);
            return NULL;
        }
        PyTuple_SET_ITEM(first, f, word);
    }
    PyMem_Free(tokens);
    PyMem_Free(seen);
    if (n < most && _PyBytes_Resize(&packed, 8 * n) < 0) {
        Py_DECREF(first);
        return NULL;
    }
    return Py_BuildValue("(NnnN)", packed, ntok, marks, first);
}

static PyMethodDef module_methods[] = {
    {"word_grams", (PyCFunction)word_grams, METH_O, word_grams_doc},
    {"word_hashes", (PyCFunction)(void (*)(void))word_hashes, METH_FASTCALL, word_hashes_doc},
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
    if (PyType_Ready(&GramTableType) < 0) {
        return NULL;
    }
    if (hash_token == NULL) {
        hash_token = PyUnicode_InternFromString("#");
        space = PyUnicode_InternFromString(" ");
        if (hash_token == NULL || space == NULL) {
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
    return m;
}
