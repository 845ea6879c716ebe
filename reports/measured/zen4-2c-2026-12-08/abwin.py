import json, sys, statistics as st
d = json.load(open(sys.argv[1]))
rows = d["rows"] if isinstance(d, dict) and "rows" in d else d
for r in rows:
    if "read_bw_rounds" not in r: continue
    bws = r["read_bw_rounds"]; a = r["rounds_a"]; b = r["rounds_b"]
    best = max(x for x in bws if x)
    nb = r.get("decode_bytes") or None
    fa, fb, sa, sb, rf, rs = [], [], [], [], [], []
    for i in range(len(a)):
        w = [bws[i], bws[i+1] if i + 1 < len(bws) else bws[i]]
        if all(x and x >= 0.8*best for x in w): rf.append(a[i]/b[i]); fa.append(a[i]); fb.append(b[i])
        elif all(x and x < 0.7*best for x in w): rs.append(a[i]/b[i]); sa.append(a[i]); sb.append(b[i])
    f = lambda v: f"{st.median(v)*(1e3 if st.median(v)<1e-1 else 1):.3f}" if v else "-"
    print(r["case"], r["threads"], f"best {best:.1f}", f"fast n={len(rf)} A {f(fa)} B {f(fb)} ratio {f(rf)}", f"| slow n={len(rs)} A {f(sa)} B {f(sb)} ratio {f(rs)}")
