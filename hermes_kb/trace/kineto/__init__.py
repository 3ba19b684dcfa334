"""The Kineto (PyTorch profiler) reader: ``schema`` (the events as msgspec structs), ``frames``
(events to columns), ``joins`` (launches to kernels, annotations to steps, collectives) and
``reader`` (one file to a RankTrace)."""
