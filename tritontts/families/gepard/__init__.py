"""Gepard-1.0 (nineninesix): a talker of per-dimension FSQ codes decoded by NVIDIA's NanoCodec."""
