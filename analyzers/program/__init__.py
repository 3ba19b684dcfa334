"""The user's program: each step split into program phases (data, forward, backward, the
optimizer, collectives, the user's own code, untraced; ``phases``) and the user's functions
that hold time outside those phases (``functions``)."""
