"""The base layer: what every other part of hermes uses and that imports nothing else of hermes:
errors and their exit codes, input limits, text sanitising, worker processes, CPU and device
facts (peaks, links), tensor element types, where the shipped folders are, the version."""
