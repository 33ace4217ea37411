"""passctl's tools: the ``passctl`` command line, the report, and the numeric check."""
