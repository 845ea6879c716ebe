"""Tools that measure the engine rather than tune it: `bench` (the MoE layer beside NumPy
and PyTorch, tuned against default) and `soak` (memory over a long run). They sit above
the tuner: they use its problems and weights (python -m colibri_bench --help)."""
