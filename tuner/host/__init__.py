"""Host probing: what this machine is (CPU, caches, NUMA, compilers) and what its memory
can stream (the bandwidth probe), and the `probe` and `profiles` commands."""
