"""Neural networks shared by several families (HiFT, DiT, the Qwen3 stack, the higgs audio
codec, CAM++, mel features, gated delta, RAS) and where a network runs (runtime: TensorRT,
onnxruntime or PyTorch). No serving imports, no family imports."""
