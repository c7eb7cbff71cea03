"""testinfra's `host` fixture comes from the pytest-testinfra plugin (--hosts=...)."""
