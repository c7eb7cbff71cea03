"""Engine patch sets: structural libcst codemods, applied atomically and proven afterwards."""
