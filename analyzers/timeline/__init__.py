"""The timeline of each step: ``steps`` (the windows), ``overlap`` (compute, communication and
host busy per step), ``critical_path`` (the dependency graph and each step's path through it),
``breakdown`` (the step split into exclusive components) and ``fluctuation`` (step-time
variation and spikes)."""
