/* torchlab_jpeg: decode only the region of a JPEG that a crop needs, with libjpeg-turbo.
 *
 * image_size(data) reads the header: (width, height, supported), or None when it is not a JPEG libjpeg
 * can read. supported is false for what the region path leaves to Pillow: progressive files (their rows
 * cannot be skipped without decoding every scan) and colour spaces other than YCbCr, RGB and grey (CMYK,
 * YCCK).
 *
 * decode_region(data, scale_denom, x0, y0, x1, y1) decodes at 1/scale_denom (DCT scaling, as Pillow's
 * draft) the columns x0..x1 and rows y0..y1 of the scaled image, as RGB: jpeg_crop_scanline narrows the
 * decode to whole iMCU columns around x0..x1 (so the region may start left of x0 and be wider),
 * jpeg_skip_scanlines passes over the rows above y0, and decoding stops after row y1. Where chroma is
 * subsampled (4:2:0, 4:2:2), libjpeg's fancy upsampling at a region's edges reads chroma the region left out,
 * so those files decode a MARGIN around it too, for the caller to cut away; 4:4:4 and grey files decode
 * exactly the pixels of a full decode without one. It returns
 * (rgb bytearray, x_offset, y_offset, width, height) of what was decoded, or None when libjpeg reports an
 * error or a warning (a truncated or corrupt file): the caller then falls back to Pillow, which says why.
 *
 * Both release the GIL around the libjpeg calls, so that decode threads run in parallel: while it is released
 * no Python API is called, and an error's longjmp lands where the GIL is taken back first (gil_taken).
 *
 * libjpeg-turbo is opened by its full path with dlopen (RTLD_LOCAL | RTLD_DEEPBIND), not linked: torchvision
 * and Pillow load copies of libjpeg of their own, and one of them answers to the soname libjpeg.so.62, so a
 * linked dependency would be bound to that copy, which lacks jpeg_skip_scanlines.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <setjmp.h>
#include <stdio.h>
#include <jpeglib.h>

static const char *const LIBJPEG_PATHS[] = {
    "/usr/lib/x86_64-linux-gnu/libjpeg.so.62", "/usr/lib/aarch64-linux-gnu/libjpeg.so.62",
    "/usr/lib64/libjpeg.so.62", "/usr/lib/libjpeg.so.62", NULL,
};

/* The libjpeg functions used, from the copy this module opens. */
static struct {
    struct jpeg_error_mgr *(*std_error)(struct jpeg_error_mgr *);
    void (*create_decompress)(j_decompress_ptr, int, size_t);
    void (*mem_src)(j_decompress_ptr, const unsigned char *, unsigned long);
    int (*read_header)(j_decompress_ptr, boolean);
    boolean (*start_decompress)(j_decompress_ptr);
    void (*crop_scanline)(j_decompress_ptr, JDIMENSION *, JDIMENSION *);
    JDIMENSION (*skip_scanlines)(j_decompress_ptr, JDIMENSION);
    JDIMENSION (*read_scanlines)(j_decompress_ptr, JSAMPARRAY, JDIMENSION);
    void (*abort_decompress)(j_decompress_ptr);
    void (*destroy_decompress)(j_decompress_ptr);
} libjpeg;

static int open_libjpeg(void)
{
    void *handle = NULL;
    for (const char *const *path = LIBJPEG_PATHS; *path != NULL && handle == NULL; path++)
        handle = dlopen(*path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (handle == NULL)
        return 0;
#define FIND(field, name) (*(void **)&libjpeg.field = dlsym(handle, name)) != NULL
    return FIND(std_error, "jpeg_std_error") && FIND(create_decompress, "jpeg_CreateDecompress") &&
           FIND(mem_src, "jpeg_mem_src") && FIND(read_header, "jpeg_read_header") &&
           FIND(start_decompress, "jpeg_start_decompress") && FIND(crop_scanline, "jpeg_crop_scanline") &&
           FIND(skip_scanlines, "jpeg_skip_scanlines") && FIND(read_scanlines, "jpeg_read_scanlines") &&
           FIND(abort_decompress, "jpeg_abort_decompress") && FIND(destroy_decompress, "jpeg_destroy_decompress");
#undef FIND
}

struct error_escape {
    struct jpeg_error_mgr manager;
    jmp_buf escape;
};

static void escape_on_error(j_common_ptr cinfo)
{
    longjmp(((struct error_escape *)cinfo->err)->escape, 1);
}

/* Warnings (level -1: corrupt data, a premature end) are errors here; trace messages (level >= 0) are not. */
static void escape_on_warning(j_common_ptr cinfo, int level)
{
    if (level < 0)
        escape_on_error(cinfo);
}

/* Pixels decoded around a region of a file with subsampled chroma: without them, edge columns differ from a
 * full decode by up to 16 levels. */
#define MARGIN 16

static int chroma_subsampled(const struct jpeg_decompress_struct *cinfo)
{
    for (int i = 0; i < cinfo->num_components; i++)
        if (cinfo->comp_info[i].h_samp_factor != cinfo->max_h_samp_factor ||
            cinfo->comp_info[i].v_samp_factor != cinfo->max_v_samp_factor)
            return 1;
    return 0;
}

static int region_supported(const struct jpeg_decompress_struct *cinfo)
{
    J_COLOR_SPACE space = cinfo->jpeg_color_space;
    return !cinfo->progressive_mode && (space == JCS_YCbCr || space == JCS_RGB || space == JCS_GRAYSCALE);
}

static void start_reading(struct jpeg_decompress_struct *cinfo, struct error_escape *errors)
{
    cinfo->err = libjpeg.std_error(&errors->manager);
    errors->manager.error_exit = escape_on_error;
    errors->manager.emit_message = escape_on_warning;
    libjpeg.create_decompress(cinfo, JPEG_LIB_VERSION, sizeof(struct jpeg_decompress_struct));
}

/* Only after setjmp: jpeg_mem_src errors on empty data (JERR_INPUT_EMPTY), and an escape needs its target. */
static void read_header(struct jpeg_decompress_struct *cinfo, const Py_buffer *data)
{
    libjpeg.mem_src(cinfo, (const unsigned char *)data->buf, (unsigned long)data->len);
    libjpeg.read_header(cinfo, TRUE);
}

/* The GIL, released with release_gil and taken back with take_gil, which does nothing where it is held: the
 * error path calls it whichever side of a release the longjmp came from. */
static void release_gil(PyThreadState *volatile *saved)
{
    *saved = PyEval_SaveThread();
}

static void take_gil(PyThreadState *volatile *saved)
{
    if (*saved != NULL) {
        PyEval_RestoreThread(*saved);
        *saved = NULL;
    }
}

static PyObject *image_size(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer data;
    struct jpeg_decompress_struct cinfo;
    struct error_escape errors;
    PyThreadState *volatile saved = NULL;
    PyObject *result;

    if (!PyArg_ParseTuple(args, "y*", &data))
        return NULL;
    release_gil(&saved);
    start_reading(&cinfo, &errors);
    if (setjmp(errors.escape)) {
        libjpeg.destroy_decompress(&cinfo);
        take_gil(&saved);
        PyBuffer_Release(&data);
        Py_RETURN_NONE;
    }
    read_header(&cinfo, &data);
    take_gil(&saved);
    result = Py_BuildValue("IIO", cinfo.image_width, cinfo.image_height,
                           region_supported(&cinfo) ? Py_True : Py_False);
    libjpeg.destroy_decompress(&cinfo);
    PyBuffer_Release(&data);
    return result;
}

static PyObject *decode_region(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer data;
    int scale_denom, x0, y0, x1, y1;
    struct jpeg_decompress_struct cinfo;
    struct error_escape errors;
    PyThreadState *volatile saved = NULL;
    PyObject *volatile pixels = NULL;
    JSAMPROW first_row;
    JDIMENSION x_offset, width;

    if (!PyArg_ParseTuple(args, "y*iiiii", &data, &scale_denom, &x0, &y0, &x1, &y1))
        return NULL;
    release_gil(&saved);
    start_reading(&cinfo, &errors);
    if (setjmp(errors.escape)) {
        libjpeg.destroy_decompress(&cinfo);
        take_gil(&saved);
        PyBuffer_Release(&data);
        Py_XDECREF(pixels);
        Py_RETURN_NONE;
    }
    read_header(&cinfo, &data);
    if (!region_supported(&cinfo) || !(scale_denom == 1 || scale_denom == 2 || scale_denom == 4 || scale_denom == 8))
        longjmp(errors.escape, 1);
    cinfo.out_color_space = JCS_RGB;
    cinfo.scale_num = 1;
    cinfo.scale_denom = (unsigned int)scale_denom;
    cinfo.dct_method = JDCT_ISLOW;
    libjpeg.start_decompress(&cinfo);
    if (chroma_subsampled(&cinfo)) {
        x0 -= MARGIN;
        y0 -= MARGIN;
        x1 += MARGIN;
        y1 += MARGIN;
    }
    if (x0 < 0) x0 = 0;
    if (y0 < 0) y0 = 0;
    if (x1 > (int)cinfo.output_width) x1 = (int)cinfo.output_width;
    if (y1 > (int)cinfo.output_height) y1 = (int)cinfo.output_height;
    if (x1 <= x0 || y1 <= y0)
        longjmp(errors.escape, 1);
    x_offset = (JDIMENSION)x0;
    width = (JDIMENSION)(x1 - x0);
    if (width < cinfo.output_width)
        libjpeg.crop_scanline(&cinfo, &x_offset, &width);
    if (y0 > 0)
        libjpeg.skip_scanlines(&cinfo, (JDIMENSION)y0);
    /* The output's size is known now: the GIL is taken back to make the bytearray, then released again. */
    take_gil(&saved);
    pixels = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)width * 3 * (y1 - y0));
    if (pixels == NULL) {
        libjpeg.destroy_decompress(&cinfo);
        PyBuffer_Release(&data);
        return NULL;
    }
    first_row = (JSAMPROW)PyByteArray_AS_STRING(pixels);
    release_gil(&saved);
    while (cinfo.output_scanline < (JDIMENSION)y1) {
        JSAMPROW row = first_row + (size_t)(cinfo.output_scanline - y0) * width * 3;
        libjpeg.read_scanlines(&cinfo, &row, 1);
    }
    libjpeg.abort_decompress(&cinfo); /* the rows below the region are never decoded */
    libjpeg.destroy_decompress(&cinfo);
    take_gil(&saved);
    PyBuffer_Release(&data);
    return Py_BuildValue("NIiIi", pixels, x_offset, y0, width, y1 - y0);
}

static PyMethodDef methods[] = {
    {"image_size", image_size, METH_VARARGS, "image_size(data) -> (width, height, supported) or None"},
    {"decode_region", decode_region, METH_VARARGS,
     "decode_region(data, scale_denom, x0, y0, x1, y1) -> (rgb bytearray, x_offset, y_offset, width, height) or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "torchlab_jpeg", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_torchlab_jpeg(void)
{
    if (!open_libjpeg()) {
        PyErr_SetString(PyExc_ImportError, "torchlab_jpeg: no libjpeg-turbo with jpeg_skip_scanlines (libjpeg62-turbo)");
        return NULL;
    }
    return PyModule_Create(&module);
}
