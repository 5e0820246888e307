"""Test support shared by the test suite and the benchmarks (never imported when serving):
a real tritonserver + front stack, audio decoding, gRPC streaming, and a stand-in for
Triton's `triton_python_backend_utils` to run stage models on CPU without a server."""
