"""The built-in smoke test: a DFlash drafter training workload (``drafter``, shipped to the
target) and its host side (``host``: params from flags, run through a transport, summary)."""
