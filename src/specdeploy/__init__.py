"""specdeploy: from a bare multi-GPU host to an LLM served with EAGLE-3 speculative decoding."""

__version__ = "0.1.0"
