"""`eagle3 run` on one machine: the local executor, its producers, status, dry run, plan and terminal
display."""
