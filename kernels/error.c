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

size_t cb_dtype_elem_bytes(int dtype) {
    switch (dtype) {
    case COLIBRI_F32: return 4;
    case COLIBRI_BF16: return 2;
    case COLIBRI_INT8: return 1;
    default: return 0;
    }
}
