import sys, numpy as np, time
from colibri import MoELayer
E,H,I,k=128,2048,768,8
rng=np.random.default_rng(0)
r=rng.standard_normal((E,H),dtype=np.float32)*0.02
g=rng.standard_normal((E,I,H),dtype=np.float32)*0.02; u=g.copy(); d=rng.standard_normal((E,H,I),dtype=np.float32)*0.02
L=MoELayer(r,g,u,d,top_k=k,weight_dtype="int4",threads=2,lib=sys.argv[1])
x=rng.standard_normal((128,H),dtype=np.float32)
for i in range(40): L(x)
