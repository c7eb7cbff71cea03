"""The preflight phase: the supported-platform matrix and the host checks (disk, serving port),
before anything changes."""
