"""The ``sm12x`` subcommands, one module each: status, selftest, bundle, launch, doctor."""
