"""vLLM-compatible speculative-decoding emulator (``specroute emulate``); see README.md here."""
