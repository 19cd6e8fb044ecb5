"""What stages read and write: datasets, conversations, prepared rows, hidden-state files, draft
checkpoints."""
