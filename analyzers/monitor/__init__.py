"""Facts from the always-on monitor's logs (``run_log``), and the joins of a run's logs with its
captures: what profiling cost the captured steps (``profiler_overhead``) and the CPU budget of a
data-loading fix (``loader_cores``)."""
