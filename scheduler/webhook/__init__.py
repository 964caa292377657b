"""koord-webhook: the admission webhook front end (mutating and validating pods), its own
process (``koord-scheduler webhook serve``), deciding with the scheduler's own decoders."""
