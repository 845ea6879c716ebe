# Scratch (2026-12-08): run in a checkout's root to instrument kernels/layer.c's decode path with
# per-phase clocks (PT[][], PTN; read by phases.py through cffi, dumped at exit); never committed.
p = 'kernels/layer.c'; s = open(p).read()
def sub(old, new):
    global s
    assert old in s, old[:60]
    s = s.replace(old, new, 1)
sub('static int cb_default_threads = 0;', '''static int cb_default_threads = 0;
double PT[16][2]; long PTN; /* SCRATCH phase timing */
static void __attribute__((destructor)) pt_dump(void) {
    if (!PTN) return;
    fprintf(stderr, "PT calls %ld\\n", PTN);
    for (int i = 0; i < 16; ++i) if (PT[i][0] > 0 || PT[i][1] > 0) fprintf(stderr, "PT %2d %9.2f %9.2f us\\n", i, 1e6 * PT[i][0] / PTN, 1e6 * PT[i][1] / PTN);
}''')
sub('''        memset(ready, 0, (size_t)njobs);
        if (xb) part->xprep(L->dtype, x, H, H, 0, T, mine);''', '''        double q0 = cb_now_s();
        memset(ready, 0, (size_t)njobs);
        if (xb) part->xprep(L->dtype, x, H, H, 0, T, mine);''')
sub('''                         items[3 * i + 2], jb->h, jb->ex->inter, ws, xb ? mine : NULL);
        }
#pragma omp barrier
        const int *dit''', '''                         items[3 * i + 2], jb->h, jb->ex->inter, ws, xb ? mine : NULL);
        }
        double q1 = cb_now_s();
#pragma omp barrier
        double q2 = cb_now_s();
        const int *dit''')
sub('''                           ws, hoff[j] != (size_t)-1 ? hmine + hoff[j] : NULL);
        }
#pragma omp barrier
        int c0, c1;''', '''                           ws, hoff[j] != (size_t)-1 ? hmine + hoff[j] : NULL);
        }
        double q3 = cb_now_s();
#pragma omp barrier
        double q4 = cb_now_s();
        int c0, c1;''')
sub('''                for (int c = c0; c < c1; ++c) yt[c] += p[c];
            }
        }
    }
    return COLIBRI_OK;''', '''                for (int c = c0; c < c1; ++c) yt[c] += p[c];
            }
        }
        double q5 = cb_now_s();
        if (tid < 2) { PT[4][tid] += q0 - PTX; PT[5][tid] += q1 - q0; PT[6][tid] += q2 - q1; PT[7][tid] += q3 - q2; PT[8][tid] += q4 - q3; PT[9][tid] += q5 - q4; }
    }
    return COLIBRI_OK;''')
sub('static int run_decode_claimed(', 'static double PTX;\nstatic int run_decode_claimed(')
sub('''    cb_clear_error();
    if (!L) return cb_fail(COLIBRI_ERR_INVALID, "layer is NULL");
    if (T < 0) return cb_fail(COLIBRI_ERR_INVALID, "n_tokens %d < 0", T);''', '''    cb_clear_error();
    const double e0 = cb_now_s();
    if (!L) return cb_fail(COLIBRI_ERR_INVALID, "layer is NULL");
    if (T < 0) return cb_fail(COLIBRI_ERR_INVALID, "n_tokens %d < 0", T);''')
sub('''    st = colibri_route(logits, T, E, &L->route, isel, wsel, cnt);
    if (st) return st;''', '''    const double e1 = cb_now_s();
    st = colibri_route(logits, T, E, &L->route, isel, wsel, cnt);
    if (st) return st;''')
sub('''    } else if (claimed) {
        st = run_decode_claimed(''', '''    } else if (claimed) {
        PTX = cb_now_s(); PT[1][0] += e1 - e0; PT[2][0] += PTX - e1;
        st = run_decode_claimed(''')
sub('''    for (int t = 0; t < T && nbad; ++t)
        if (bad[t])
            for (int c = 0; c < H; ++c) y[(size_t)t * H + c] = NAN;
    return COLIBRI_OK;
}''', '''    for (int t = 0; t < T && nbad; ++t)
        if (bad[t])
            for (int c = 0; c < H; ++c) y[(size_t)t * H + c] = NAN;
    if (claimed) { PT[0][0] += cb_now_s() - e0; PTN++; }
    return COLIBRI_OK;
}''')
open(p, 'w').write(s)
