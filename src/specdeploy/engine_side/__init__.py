"""Code that runs inside the engine's environment (image or engine venv), not on the controller.

It may import torch, transformers and tokenizers, which the controller does not install.
"""
