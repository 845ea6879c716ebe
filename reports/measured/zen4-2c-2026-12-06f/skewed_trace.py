"""A skewed routing trace for a model file: each token's hidden state points at 8 experts drawn
from a Zipf-like law over the experts (rank r weighs 1/(r+1)^s), through the first layer's
router rows; writes [tokens, hidden] float32 .npy. Trained MoE routers favour some experts;
random-init ones route near uniformly, so this stands in for a trained model's trace."""
import sys
import numpy as np
from colibri.modelfile import read_header
path, out, tokens, s = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
hdr = read_header(path)
E, H, k = hdr["n_experts"], hdr["hidden"], hdr["top_k"]
raw = np.memmap(path, np.uint8, mode="r")
t = hdr["tensors"][hdr["slots"][0][0]]
router = np.frombuffer(raw, "<f4", E * H, t["offset"]).reshape(E, H)
rng = np.random.default_rng(0)
p = 1.0 / (np.arange(E) + 1.0) ** s
p /= p.sum()
perm = rng.permutation(E)  # which experts are hot
X = np.empty((tokens, H), np.float32)
for i in range(tokens):
    chosen = perm[rng.choice(E, size=k, replace=False, p=p)]
    d = router[chosen].sum(0)
    X[i] = d / np.linalg.norm(d) * np.sqrt(H) * 0.5 + rng.standard_normal(H).astype(np.float32) * 0.5
np.save(out, X)
print(out, X.shape)
