"""Facts from the always-on monitor's logs (``run_log``, over ``series``: a rank's steps and the
monitor's notes; ``steps``: steps and spikes; ``slow_rank``; ``cpu``: CPU contention and threads;
``env_settings``; ``notes``: the monitor's decisions as report warnings), and the joins of a run's
logs with its captures: what profiling cost the captured steps (``profiler_overhead``) and the
CPU budget of a data-loading fix (``loader_cores``)."""
