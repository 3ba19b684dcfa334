"""The knowledge base: the YAML rules (rules/: facts -> bottlenecks) and cases (cases/:
bottlenecks -> causes and fixes) as validated models (``models``, ``loader``), the engine-neutral
condition language (``conditions``), and inference by durable-rules (``durable_engine``) or the
pure-Python oracle (``matches``), chosen by ``engine``. ``testing`` runs every item's own
examples; ``explain`` says why an item did or did not fire."""
