"""The hand-off: the training thread's snapshot and the drop-oldest queue; standard library only."""
