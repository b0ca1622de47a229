"""The peer side of the kernel benchmark: vLLM's FA3 paged decode timed on the rows of
bench/cuda/bench_decode.cu's grid, in the same invocation (entry point: bench/peer_fa3.py)."""
