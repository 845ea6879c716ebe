p='kernels/layer.c'; s=open(p).read()
s=s.replace('static int cb_default_threads = 0;', '''static int cb_default_threads = 0;
double PT[16][2]; long PTN; /* SCRATCH */''',1)
old='''        cb_walk w = cb_walk_from(ngu, tid, nth);
        for (int i; (i = cb_walk_next(taken, ngu, &w)) >= 0;) {
            const cb_job *jb = &gjobs[items[3 * i]];
            part->gateup(L->dtype, &jb->ex->gate, &jb->ex->up, x, H, jb->tok, jb->ntok, items[3 * i + 1],
                         items[3 * i + 2], jb->h, jb->ex->inter, ws, xprep);
        }
        if (do_down) {
#pragma omp barrier
            if (prepbuf) {
                phase_prep(L, jobs, njobs, tid, nth);
#pragma omp barrier
            }'''
new='''        double q0 = cb_now_s();
        cb_walk w = cb_walk_from(ngu, tid, nth);
        for (int i; (i = cb_walk_next(taken, ngu, &w)) >= 0;) {
            const cb_job *jb = &gjobs[items[3 * i]];
            part->gateup(L->dtype, &jb->ex->gate, &jb->ex->up, x, H, jb->tok, jb->ntok, items[3 * i + 1],
                         items[3 * i + 2], jb->h, jb->ex->inter, ws, xprep);
        }
        double q1 = cb_now_s(), q2 = q1, q3 = q1;
        if (do_down) {
#pragma omp barrier
            q2 = cb_now_s();
            if (prepbuf) {
                phase_prep(L, jobs, njobs, tid, nth);
#pragma omp barrier
            }
            q3 = cb_now_s();'''
assert old in s; s=s.replace(old,new,1)
old='''                    part->rows_acc(L->dtype, &jobs[j].ex->down, jobs[j].h, jobs[j].ex->inter, jobs[j].ntok,
                                   jobs[j].tw, jobs[j].tok, c0, c1, y, H, ws, jobs[j].prep);
            }
        }
    }
    return COLIBRI_OK;'''
new='''                    part->rows_acc(L->dtype, &jobs[j].ex->down, jobs[j].h, jobs[j].ex->inter, jobs[j].ntok,
                                   jobs[j].tw, jobs[j].tok, c0, c1, y, H, ws, jobs[j].prep);
            }
        }
        double q4 = cb_now_s();
        if (tid < 2 && T > 2) { PT[3][tid] += q0 - PTX; PT[4][tid] += q1 - q0; PT[5][tid] += q2 - q1; PT[6][tid] += q3 - q2; PT[7][tid] += q4 - q3; }
    }
    return COLIBRI_OK;'''
assert old in s; s=s.replace(old,new,1)
s=s.replace('static int run_turn(', 'static double PTX;\nstatic int run_turn(',1)
old='''    } else if (njobs) {
        st = run_turn('''
new='''    } else if (njobs) {
        PTX = cb_now_s(); PT[0][0] += PTX - e0;
        st = run_turn('''
assert old in s; s=s.replace(old,new,1)
old='''    cb_clear_error();
    if (!L) return cb_fail(COLIBRI_ERR_INVALID, "layer is NULL");
    if (T < 0) return cb_fail(COLIBRI_ERR_INVALID, "n_tokens %d < 0", T);'''
assert old in s
s=s.replace(old,'''    cb_clear_error();
    const double e0 = cb_now_s();
    if (!L) return cb_fail(COLIBRI_ERR_INVALID, "layer is NULL");
    if (T < 0) return cb_fail(COLIBRI_ERR_INVALID, "n_tokens %d < 0", T);''',1)
old='''    for (int t = 0; t < T && nbad; ++t)
        if (bad[t])
            for (int c = 0; c < H; ++c) y[(size_t)t * H + c] = NAN;
    return COLIBRI_OK;
}'''
new='''    for (int t = 0; t < T && nbad; ++t)
        if (bad[t])
            for (int c = 0; c < H; ++c) y[(size_t)t * H + c] = NAN;
    if (T > 2 && !L->cache) { PT[1][0] += cb_now_s() - e0; PTN++; }
    return COLIBRI_OK;
}'''
assert old in s; s=s.replace(old,new,1)
open(p,'w').write(s)
