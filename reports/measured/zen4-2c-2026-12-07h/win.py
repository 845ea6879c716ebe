import json, sys
for f in sys.argv[1:]:
    d = json.load(open(f))
    for v, r in d["results"].items():
        mb = r["decode_bandwidth"]["patched"]["moe"]
        w = mb["windows"]
        g = [mb["bytes"] / (x["moe_decode_ms_per_token"] * 1e-3) / 1e9 for x in r["rounds"]["patched"]]
        ar = r.get("read_bw_around", {}).get("patched")
        al = r["decode_bandwidth"]["patched_moe_alone"]["moe_alone"]["windows"]
        f1 = lambda x: "-" if x is None else f"{100*x:.1f}"
        print(f.split("/")[-1], v, "around", [[round(a, 1) for a in p] for p in ar] if ar else None, "GB/s", [round(x, 1) for x in g],
              f"all {f1(w['all'])} fast {f1(w['fast'])} (n={w['fast_rounds']}) slow {f1(w['slow'])} (n={w['slow_rounds']}) best {w['best_gbps']:.1f}",
              f"| alone fast {f1(al['fast'])} (n={al['fast_rounds']}) slow {f1(al['slow'])} (n={al['slow_rounds']})")
