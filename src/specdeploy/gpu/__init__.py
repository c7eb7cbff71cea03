"""GPU host facts: parse real `nvidia-smi` output, check it before provisioning, and simulate hosts we lack."""
