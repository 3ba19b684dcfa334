"""What-if: the sets of events a fix acts on (``sets``, registered by any analyzer) and the replay
of the rank's dependency graph with a set shortened (``replay``)."""
