"""The timeline of each step: ``steps`` (the windows), ``overlap`` (compute, communication and
host busy per step; the tables and sets it cuts: ``device_events`` (every device activity),
``host_sets`` (host busy, gloo communication), ``hta`` (HolisticTraceAnalysis's definitions)),
``critical_path`` (each step's path through the dependency graph; the graph: ``graph`` (its
vocabulary), ``graph_host`` (host nodes), ``graph_device`` (device nodes, launch, sync and
event-wait edges), ``graph_build`` (the assembly, joins between threads, predecessors)),
``breakdown`` (the step split into exclusive components) and ``fluctuation`` (step-time
variation and spikes)."""
