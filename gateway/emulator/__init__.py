"""vLLM-compatible speculative-decoding emulator (``specroute emulate``); see the README."""
