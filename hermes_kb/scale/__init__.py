"""Scale-out: a job of many ranks analysed rank by rank so that memory is bounded by the ranks in
flight (docs/scale.md). ``stream`` is one rank's part and the cross-rank gather; ``local`` and
``on_dask`` are the two executors of the per-rank stage; ``jobs`` chooses between them;
``sample`` picks K ranks of a large job by a first pass over their step times."""
