"""Reports of what the controller recorded: an HTML page per host of its rollouts and benchmarks."""
