"""`specdeploy watch`: the startup watchdog (liveness, root cause, progress, stalls, readiness)."""
