/* error.c — thread-local error message and small shared helpers. */
#include <stdarg.h>
#include <stdio.h>

#include "internal.h"

static _Thread_local char cb_err[512];

const char *colibri_last_error(void) { return cb_err; }

const char *colibri_version(void) { return "0.1.0"; }

void cb_clear_error(void) { cb_err[0] = '\0'; }

int cb_fail(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cb_err, sizeof cb_err, fmt, ap);
    va_end(ap);
    return status;
}

int cb_dtype_valid(int dtype) { return dtype >= COLIBRI_F32 && dtype <= COLIBRI_INT4K; }

size_t cb_mat_data_bytes(int dtype, size_t rows, size_t cols) {
    switch (dtype) {
    case COLIBRI_F32: return rows * cols * 4;
    case COLIBRI_BF16: return rows * cols * 2;
    case COLIBRI_INT8: return rows * cols;
    case COLIBRI_INT4: return rows * ((cols + CB_INT4_GROUP - 1) / CB_INT4_GROUP) * 16;
    case COLIBRI_INT4K: return rows * cb_k4_row_bytes(cols);
    default: return 0;
    }
}

size_t cb_mat_scale_count(int dtype, size_t rows, size_t cols) {
    switch (dtype) {
    case COLIBRI_INT8: return rows;
    case COLIBRI_INT4: return rows * ((cols + CB_INT4_GROUP - 1) / CB_INT4_GROUP);
    default: return 0;
    }
}
