/* infer_model MODEL INPUT T OUTPUT: run a Colibri model file on T tokens with nothing but
 * colibri.h (colibri_load_model, colibri_infer, colibri_free_model). INPUT holds T x hidden
 * float32 values; OUTPUT receives as many. Built natively and cross-built for each Arm
 * profile: `python -m tuner verify` and tests/colibri_build/test_arm_emulated.py run it
 * under qemu-user against the NumPy reference and against the native library.
 * Exit status: 0 done, 1 a Colibri or file error (on stderr), 2 usage. */
#include <stdio.h>
#include <stdlib.h>

#include "colibri.h"

static int fail(const char *what) {
    const char *why = colibri_last_error();
    fprintf(stderr, "infer_model: %s: %s\n", what, why && *why ? why : "(no detail)");
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: infer_model MODEL INPUT T OUTPUT\n");
        return 2;
    }
    const int T = atoi(argv[3]);
    if (T < 1) {
        fprintf(stderr, "usage: T must be a positive token count, got '%s'\n", argv[3]);
        return 2;
    }
    colibri_model *m = colibri_load_model(argv[1]);
    if (!m) return fail("colibri_load_model");
    const size_t n = (size_t)T * (size_t)colibri_model_hidden(m);
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    int rc = 1;
    FILE *f = NULL;
    if (!x || !y) {
        fprintf(stderr, "infer_model: out of memory\n");
        goto done;
    }
    if (!(f = fopen(argv[2], "rb")) || fread(x, sizeof *x, n, f) != n) {
        fprintf(stderr, "infer_model: cannot read %zu floats from %s\n", n, argv[2]);
        goto done;
    }
    fclose(f);
    f = NULL;
    if (colibri_infer(m, x, y, T) != COLIBRI_OK) {
        rc = fail("colibri_infer");
        goto done;
    }
    if (!(f = fopen(argv[4], "wb")) || fwrite(y, sizeof *y, n, f) != n) {
        fprintf(stderr, "infer_model: cannot write %s\n", argv[4]);
        goto done;
    }
    rc = 0;
done:
    if (f && fclose(f) != 0 && rc == 0) rc = 1;
    free(x);
    free(y);
    colibri_free_model(m);
    return rc;
}
