"""The fleet: several engine hosts behind one router, rolled out in batches."""
