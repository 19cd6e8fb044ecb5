"""What every stage program runs in: its context, errors, lock, process groups and live reporter."""
